"""Trial errors and experiment restore (issue 4, tests 6-8) on a real scheduler + workers.

- Ray's restore matrix: errored trials stay errored (default), continue from their
  checkpoint (``resume_errored``) or start over (``restart_errored``), with the
  per-trial counts of Ray's ``test_tuner_restore.py``.
- A checkpoint write torn halfway (a filesystem wrapper that dies after n bytes):
  the previous valid checkpoint is what the trial continues from.
- ``max_failures``: a trial that always raises gets exactly 1 + max_failures attempts.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import dasktune as tune
from dasktune import runtime
from dasktune.trial import ERROR, TERMINATED

pytestmark = pytest.mark.slow
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def client(dask_processes, monkeypatch) -> Iterator[Any]:
    """dasktune on a real ``dask scheduler`` with 2 workers that can import this module.

    The client is swapped in for the test only, so an embedded cluster another test
    module started stays as it was.
    """
    from distributed import Client

    procs = dask_processes(n_workers=2, env={"PYTHONPATH": TESTS_DIR})
    c = Client(procs.address, set_as_default=False)
    monkeypatch.setattr(runtime, "_client", c)
    monkeypatch.setattr(runtime, "_cluster", None)
    c.procs = procs  # type: ignore[attr-defined]
    yield c
    c.close()


def _state(checkpoint: tune.Checkpoint | None) -> dict[str, Any]:
    if checkpoint is None:
        return {"it": 0}
    with checkpoint.as_directory() as d, open(os.path.join(d, "state.pkl"), "rb") as f:
        return pickle.load(f)


def _report_checkpointed(state: dict[str, Any]) -> None:
    tmp = tempfile.mkdtemp(prefix="faults-restore-")
    try:
        with open(os.path.join(tmp, "state.pkl"), "wb") as f:
            pickle.dump(state, f)
        tune.report(dict(state), checkpoint=tune.Checkpoint.from_directory(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------- 6. restore matrix
def sometimes_failing(config: dict[str, Any]) -> None:
    """Ray's ``_train_fn_sometimes_failing``: one checkpointed report, then fail while
    the marker file exists, else one more checkpointed report."""
    state = _state(tune.get_checkpoint())
    state["it"] += 1
    _report_checkpointed(state)
    if config["fail"] and os.path.exists(config["marker"]):
        raise RuntimeError("I am failing")
    state["it"] += 1
    _report_checkpointed(state)


def _first_run(tmp_path, name: str) -> str:
    marker = tmp_path / f"fail-{name}"
    marker.write_text("")
    fails = [False, True, False, True]
    results = tune.Tuner(
        sometimes_failing,
        param_space={"id": tune.grid_search([0, 1, 2, 3]), "marker": str(marker),
                     "fail": tune.sample_from(lambda spec: fails[spec.config["id"]])},
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert len(results) == 4 and len(results.errors) == 2
    assert _its(results) == [2, 1, 2, 1]  # the failing ones errored after their 1st report
    marker.unlink()
    return str(tmp_path / name)


def _its(results) -> list[int]:
    return [r.metrics["it"] for r in sorted(results, key=lambda r: r.config["id"])]


@pytest.mark.parametrize("mode,expected,errors", [
    ("default", [2, 1, 2, 1], 2),
    ("resume_errored", [2, 3, 2, 3], 0),  # continue from the checkpoint at it=1
    ("restart_errored", [2, 2, 2, 2], 0),  # from scratch
])
def test_restore_matrix(client, tmp_path, mode, expected, errors):
    path = _first_run(tmp_path, f"matrix-{mode}")
    kwargs = {} if mode == "default" else {mode: True}
    tuner = tune.Tuner.restore(path, sometimes_failing, **kwargs)
    before = tuner.get_results()  # nothing runs for this
    assert len(before) == 4 and len(before.errors) == 2 and _its(before) == [2, 1, 2, 1]
    results = tuner.fit()
    assert len(results) == 4 and len(results.errors) == errors
    assert _its(results) == expected
    by_id = sorted(results, key=lambda r: r.config["id"])
    for r, n in zip(by_id, expected):
        # training_iteration continues from the checkpoint (restarted ones from 0), and
        # result.json holds every iteration of the surviving lineage once.
        assert r.metrics["training_iteration"] == n
        rows = [json.loads(line) for line in open(os.path.join(r.path, "result.json"))]
        its = [row["training_iteration"] for row in rows]
        if mode == "restart_errored" and r.config["fail"]:
            # A restart starts a new lineage after the old one (which ended at 1).
            assert its == [1, 1, 2]
        else:
            assert its == list(range(1, n + 1))


# ------------------------------------------------------- 7. torn checkpoint write
class TornWrites(DirFileSystem):
    """A filesystem that, once, dies ``after`` bytes into the upload of checkpoint
    number ``index``: by raising (``how="raise"``) or by ending the worker process
    (``how="exit"``). Importable on the workers (PYTHONPATH), so it pickles by reference
    with its arguments."""

    protocol = "torn"

    def __init__(self, *args: Any, marker: str = "", index: int = 2, after: int = 10,
                 how: str = "raise", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.marker, self.index, self.after, self.how = marker, index, after, how

    def put(self, lpath, rpath, *args: Any, **kwargs: Any):
        lpaths = lpath if isinstance(lpath, list) else [lpath]
        rpaths = rpath if isinstance(rpath, list) else [rpath]
        if any(f"checkpoint_{self.index:06d}" in r for r in rpaths) and self._first_time():
            with open(lpaths[0], "rb") as src:
                head = src.read(self.after)
            self.fs.pipe_file(self._join(rpaths[0]), head)
            if self.how == "exit":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(f"connection lost after {self.after} bytes")
        return super().put(lpath, rpath, *args, **kwargs)

    def _first_time(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


def counting(config: dict[str, Any]) -> None:
    state = _state(tune.get_checkpoint())
    with open(os.path.join(config["log"]), "a") as f:
        f.write(json.dumps({"start": state["it"] + 1}) + "\n")
    for _ in range(state["it"], config["iters"]):
        state["it"] += 1
        state["blob"] = "x" * 1000  # large enough that "after n bytes" tears a file
        _report_checkpointed(state)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_torn_checkpoint_write_falls_back_to_previous(client, tmp_path, how):
    fs = TornWrites(path=str(tmp_path), fs=LocalFileSystem(), marker=str(tmp_path / "torn"),
                    index=2, after=100, how=how)
    assert pickle.loads(pickle.dumps(fs)).how == how  # what the workers get
    log = tmp_path / "starts.jsonl"
    rc = tune.RunConfig(name="torn", storage_path="results", storage_filesystem=fs, verbose=0,
                        failure_config=tune.FailureConfig(max_failures=0))
    results = tune.Tuner(counting, param_space={"iters": 6, "log": str(log)},
                         run_config=rc).fit()
    trial_dir = tmp_path / "results" / "torn" / os.path.basename(results[0].path)
    torn = trial_dir / "checkpoint_000002"
    assert torn.is_dir() and not (torn / ".dasktune_checkpoint.json").exists()
    if how == "raise":
        # A storage error inside tune.report is the trial's error (max_failures=0)...
        assert len(results.errors) == 1 and results[0].metrics["it"] == 2
        tuner = tune.Tuner.restore("results/torn", counting, resume_errored=True,
                                   storage_filesystem=fs)
        results = tuner.fit()  # ...and a restore continues from checkpoint 1 (it=2)
    assert not results.errors and results[0].metrics["it"] == 6
    starts = [json.loads(line)["start"] for line in open(log)]
    assert starts == [1, 3]  # resumed right after the last valid checkpoint
    assert results[0].metrics["training_iteration"] == 6
    committed = sorted(p.name for p in trial_dir.iterdir() if p.name.startswith("checkpoint_")
                       and (p / ".dasktune_checkpoint.json").exists())
    # The torn directory was never reused; the new lineage wrote fresh ones after it.
    assert "checkpoint_000002" not in committed and len(committed) == 6
    rows = [json.loads(line) for line in open(trial_dir / "result.json")]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    del fsspec


# ------------------------------------------------------------- 8. user errors
def raises_on_third(config: dict[str, Any]) -> None:
    for i in range(1, config["iters"] + 1):
        if config["bad"] and i == 3:
            raise ValueError("bad iteration 3")
        tune.report({"i": i, "attempt": tune.get_context().get_attempt()})


def test_max_failures_counts_user_errors(client, tmp_path):
    results = tune.Tuner(
        raises_on_third,
        param_space={"bad": tune.grid_search([True, False, False]), "iters": 5},
        run_config=tune.RunConfig(name="userr", storage_path=str(tmp_path), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=2)),
    ).fit()
    trials = {t.config["bad"]: [] for t in results._trials}
    for t in results._trials:
        trials[t.config["bad"]].append(t)
    (bad,) = trials[True]
    assert bad.status == ERROR and bad.num_failures == 3 and bad.num_restarts == 0
    assert [p.attempt for p in bad.placements] == [1, 2, 3]
    assert [p.outcome for p in bad.placements] == ["error"] * 3
    assert "bad iteration 3" in bad.error_msg
    error_file = open(bad.error_file).read()
    assert error_file.count("Failure # ") == 3
    good = trials[False]
    assert [t.status for t in good] == [TERMINATED, TERMINATED]
    assert all(t.last_result["training_iteration"] == 5 and t.num_failures == 0 for t in good)
    assert len(results.errors) == 1
