"""TensorBoard event files read back with TensorBoard's own readers (issue 8).

Scalars of every numeric metric at their step (``timesteps_total`` if reported, else
``training_iteration``), and the trial's hyperparameters in the HParams plugin's records,
so the HParams tab compares trials. The events are encoded without tensorboardX, whose
import pulls in torch; these readers are the check of that encoding.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dasktune as tune


def train(config):
    for i in range(1, 4):
        tune.report({"loss": config["lr"] * i, "acc": 1.0 / i, "note": "text is skipped"})


def test_scalars_and_hparams_read_back(local_client, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    results = tune.Tuner(
        train, param_space={"lr": tune.grid_search([0.1, 0.2]), "arch": "mlp",
                            "opt": {"name": "sgd"}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="tb", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert results.num_terminated == 2

    for r in results:
        acc = EventAccumulator(r.path)
        acc.Reload()
        assert {"ray/tune/loss", "ray/tune/acc"} <= set(acc.Tags()["scalars"])
        assert not any("note" in tag for tag in acc.Tags()["scalars"])
        loss = acc.Scalars("ray/tune/loss")
        assert [e.step for e in loss] == [1, 2, 3]
        assert [e.value for e in loss] == pytest.approx([r.config["lr"] * i for i in (1, 2, 3)])

    # The HParams plugin's view of the whole experiment folder: one session per trial,
    # with that trial's hyperparameters (nested keys flattened as Ray does).
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(results.experiment_path)
    mux.Reload()
    runs = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)
    sessions = {}
    for run, tags in runs.items():
        if metadata.SESSION_START_INFO_TAG in tags:
            info = metadata.parse_session_start_info_plugin_data(
                tags[metadata.SESSION_START_INFO_TAG])
            sessions[os.path.basename(run)] = {
                k: (v.number_value if v.HasField("number_value") else v.string_value)
                for k, v in info.hparams.items()}
    assert len(sessions) == 2, runs
    by_dir = {os.path.basename(r.path): r for r in results}
    for run, hp in sessions.items():
        r = by_dir[run]
        assert hp["lr"] == pytest.approx(r.config["lr"])
        assert hp["arch"] == "mlp" and hp["opt/name"] == "sgd"


def _scalars(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(path)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train_steps(config):
    # Ray's step: timesteps_total when reported (truncated, clamped to int64), else
    # training_iteration.
    for ts in (-7, 2.5, 2**40, 1e30, None):
        metrics = {"損失": 0.25, "λ": {"ü": -3}}
        if ts is not None:
            metrics["timesteps_total"] = ts
        tune.report(metrics)


def test_unusual_steps_and_unicode_tags_read_back(local_client, tmp_path):
    results = tune.Tuner(
        train_steps,
        run_config=tune.RunConfig(name="steps", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert results.num_terminated == 1
    scalars = _scalars(results[0].path)
    steps = [-7, 2, 2**40, 2**63 - 1, 5]
    assert scalars["ray/tune/損失"] == [(s, 0.25) for s in steps]
    assert scalars["ray/tune/λ/ü"] == [(s, -3.0) for s in steps]
    assert [s for s, _ in scalars["ray/tune/timesteps_total"]] == steps[:4]
    assert [v for _, v in scalars["ray/tune/timesteps_total"]] == pytest.approx(
        [-7, 2.5, 2**40, 1e30], rel=1e-6)


_FIT_IN_FRESH_DRIVER = """
import sys
import dasktune as tune

def train(config):
    for i in range(3):
        tune.report({"loss": config["x"] * i})

tune.init(num_cpus=1, dashboard_address="127.0.0.1:0")
results = tune.Tuner(train, param_space={"x": tune.grid_search([1, 2])},
                     run_config=tune.RunConfig(name="e", storage_path=sys.argv[1],
                                               verbose=0)).fit()
print("TRIALS", " ".join(r.path for r in results))
print("IMPORTED", ",".join(m for m in ("torch", "tensorboardX") if m in sys.modules) or "-")
tune.shutdown()
"""


def test_tensorboard_logging_imports_neither_tensorboardx_nor_torch(tmp_path):
    # A fresh interpreter: the test process itself may have imported either already.
    proc = subprocess.run([sys.executable, "-c", _FIT_IN_FRESH_DRIVER, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["IMPORTED"] == "-"
    paths = lines["TRIALS"].split()
    assert len(paths) == 2
    for path in paths:
        assert [s for s, _ in _scalars(path)["ray/tune/loss"]] == [1, 2, 3]
