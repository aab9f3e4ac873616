"""``dasktune ls PATH`` as a user runs it: the console script, on a real experiment's folder."""

from __future__ import annotations

import os
import subprocess
import sys

import dasktune as tune


def _dasktune(*args: str) -> subprocess.CompletedProcess[str]:
    script = os.path.join(os.path.dirname(sys.executable), "dasktune")
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=60)


def linear(config: dict) -> None:
    for i in range(2):
        tune.report({"score": config["x"] * (i + 1)})


def test_ls_lists_the_experiment_and_its_trials(local_client, tmp_path):
    storage = str(tmp_path / "results")
    results = tune.Tuner(
        linear, param_space={"x": tune.grid_search([1, 2, 3])},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="ls_exp", storage_path=storage, verbose=0),
    ).fit()
    assert results.num_terminated == 3
    ids = sorted(r.metrics["trial_id"] for r in results)

    for path in (storage, os.path.join(storage, "ls_exp")):  # the root, or the experiment
        r = _dasktune("ls", path)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("ls_exp  [") and "3 TERMINATED" in lines[0]
        assert "metric=score (max)" in lines[0]
        trials = sorted(line.split() for line in lines[1:])
        assert [t[0] for t in trials] == ids
        assert all(t[1] == "TERMINATED" and t[2] == "iter=2" for t in trials)
        assert sorted(t[3] for t in trials) == ["score=2", "score=4", "score=6"]

    r = _dasktune("ls", "--no-trials", storage)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1


def test_ls_on_a_missing_folder_is_one_clear_line(tmp_path):
    missing = str(tmp_path / "nowhere")
    r = _dasktune("ls", missing)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"error: no such folder: {missing}"]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_storage_path_setting_is_the_default_for_tuner_and_ls(local_client, tmp_path):
    """``dasktune.storage-path`` (dasktune.yaml) is where a run without
    ``RunConfig(storage_path=...)`` writes, and where ``dasktune ls`` looks: set through
    ``dask.config.set`` here, through ``DASK_DASKTUNE__STORAGE_PATH`` for the command."""
    import dask.config

    storage = str(tmp_path / "from_setting")
    with dask.config.set({"dasktune.storage-path": storage}):
        results = tune.Tuner(
            linear, param_space={"x": tune.grid_search([1, 2])},
            run_config=tune.RunConfig(name="setting_exp", verbose=0),
        ).fit()
    assert results.num_terminated == 2
    assert results.experiment_path == os.path.join(storage, "setting_exp")
    assert os.path.exists(os.path.join(storage, "setting_exp", "experiment_state.json"))

    script = os.path.join(os.path.dirname(sys.executable), "dasktune")
    r = subprocess.run([script, "ls"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DASK_DASKTUNE__STORAGE_PATH": storage})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("setting_exp  [")
