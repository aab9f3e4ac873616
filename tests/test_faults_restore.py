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
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DaskProcesses, free_port
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import dasktune as tune
from dasktune import runtime
from dasktune.trial import ERROR, TERMINATED

pytestmark = pytest.mark.slow
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def processes(tmp_path_factory) -> Iterator[DaskProcesses]:
    """One real ``dask scheduler`` + 2 nanny workers for the module (they start slowly on
    2 cores); the workers can import this module, so :class:`TornWrites` unpickles there."""
    import subprocess
    import sys

    logdir = tmp_path_factory.mktemp("dask-logs")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": TESTS_DIR,
           "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}
    sched = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", "127.0.0.1:0"],
        env=env, stdout=open(logdir / "scheduler.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    procs = DaskProcesses(address=f"tcp://127.0.0.1:{port}", scheduler=sched, env=env,
                          logdir=str(logdir))
    try:
        for _ in range(2):
            procs.add_worker()
        procs.wait_workers(2)
        yield procs
    finally:
        procs.kill_all()


@pytest.fixture
def client(processes, monkeypatch) -> Iterator[Any]:
    """dasktune connected to :func:`processes`, swapped in for this test only (so an
    embedded cluster another module started stays as it was)."""
    from distributed import Client

    processes.wait_workers(2)  # a worker the torn-write test killed is back
    c = Client(processes.address, set_as_default=False)
    monkeypatch.setattr(runtime, "_client", c)
    monkeypatch.setattr(runtime, "_cluster", None)
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
    ("both", [2, 3, 2, 3], 0),  # both flags: resume wins, as in Ray
])
def test_restore_matrix(client, tmp_path, mode, expected, errors):
    path = _first_run(tmp_path, f"matrix-{mode}")
    kwargs = ({} if mode == "default" else
              {"resume_errored": True, "restart_errored": True} if mode == "both" else
              {mode: True})
    tuner = tune.Tuner.restore(path, sometimes_failing, **kwargs)
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
        # A restarted trial's files hold its new lineage only (issue 24: never [1, 1, 2]).
        assert its == list(range(1, n + 1))
        assert list(r.metrics_dataframe["training_iteration"]) == its


@pytest.mark.parametrize("mode", ["resume_errored", "restart_errored"])
def test_restored_get_results_is_the_saved_state(client, tmp_path, mode):
    """Ray: ``Tuner.restore(..., resume_errored=True).get_results()`` before ``fit()``
    still shows the two errored trials at it=1."""
    path = _first_run(tmp_path, f"saved-{mode}")
    before = tune.Tuner.restore(path, sometimes_failing, **{mode: True}).get_results()
    assert len(before) == 4 and _its(before) == [2, 1, 2, 1]
    assert len(before.errors) == 2


def typed_config(config: dict[str, Any]) -> None:
    """Fails once (while the marker exists) after a checkpoint; checks its config's types
    on every attempt, so a resumed attempt that got JSON-rendered values errors."""
    assert config["kind"] is OrderedDict and config["shape"] == (2, 3), config
    assert callable(config["scale"]) and config["scale"](2) == 4
    state = _state(tune.get_checkpoint())
    state["it"] += 1
    _report_checkpointed(state)
    if os.path.exists(config["marker"]):
        raise RuntimeError("fail once")
    state["it"] += 1
    _report_checkpointed(state)


def test_resumed_trial_gets_its_exact_config(client, tmp_path):
    """A class, a tuple and a function in the config survive the state file: the resumed
    attempt sees the very values the first one had (Ray pickles trial configs too)."""
    marker = tmp_path / "fail-once"
    marker.write_text("")
    space = {"kind": tune.choice([OrderedDict]), "shape": (2, 3),
             "scale": tune.sample_from(lambda spec: lambda x: x * 2), "marker": str(marker)}
    rc = tune.RunConfig(name="typed", storage_path=str(tmp_path), verbose=0)
    first = tune.Tuner(typed_config, param_space=space, run_config=rc).fit()
    assert len(first.errors) == 1 and "fail once" in str(first.errors[0])
    marker.unlink()
    results = tune.Tuner.restore(str(tmp_path / "typed"), typed_config,
                                 resume_errored=True).fit()
    assert results.num_errors == 0 and results[0].metrics["it"] == 3


# ------------------------------------------------------- 7. torn checkpoint write
class TornWrites(DirFileSystem):
    """A filesystem that, once, dies in the upload of checkpoint number ``index``.

    ``how``: ``"raise"`` fails ``after`` bytes into its first file with a permanent
    error; ``"exit"`` ends the worker process there instead; ``"after-manifest"`` lets
    the commit complete (manifest written) and ends the process before ``tune.report``
    can hand the result to the driver. Importable on the workers (PYTHONPATH), so it
    pickles by reference, with its arguments.
    """

    protocol = "torn"

    def __init__(self, *args: Any, marker: str = "", index: int = 2, after: int = 10,
                 how: str = "raise", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.marker, self.index, self.after, self.how = marker, index, after, how

    def _hit(self, rpath: str) -> bool:
        return f"checkpoint_{self.index:06d}" in rpath and not os.path.exists(self.marker)

    def _once(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def put(self, lpath, rpath, *args: Any, **kwargs: Any):
        lpaths = lpath if isinstance(lpath, list) else [lpath]
        rpaths = rpath if isinstance(rpath, list) else [rpath]
        if self.how != "after-manifest" and self._hit(rpaths[0]) and self._once():
            with open(lpaths[0], "rb") as src:
                head = src.read(self.after)
            self.fs.pipe_file(self._join(rpaths[0]), head)
            if self.how == "exit":
                os.kill(os.getpid(), signal.SIGKILL)
            raise PermissionError(f"write refused after {self.after} bytes")
        return super().put(lpath, rpath, *args, **kwargs)

    def pipe_file(self, path, *args: Any, **kwargs: Any):
        out = super().pipe_file(path, *args, **kwargs)
        if self.how == "after-manifest" and path.endswith(".dasktune_checkpoint.json") \
                and self._hit(path) and self._once():
            os.kill(os.getpid(), signal.SIGKILL)
        return out


def counting(config: dict[str, Any]) -> None:
    state = _state(tune.get_checkpoint())
    with open(os.path.join(config["log"]), "a") as f:
        f.write(json.dumps({"start": state["it"] + 1}) + "\n")
    for _ in range(state["it"], config["iters"]):
        time.sleep(config["sleep"])
        state["it"] += 1
        state["blob"] = "x" * 1000  # large enough that "after n bytes" tears a file
        _report_checkpointed(state)


def _torn_run(tmp_path, how: str) -> tuple[Any, Any, Any]:
    fs = TornWrites(path=str(tmp_path), fs=LocalFileSystem(auto_mkdir=True), marker=str(tmp_path / "torn"),
                    index=2, after=100, how=how)
    assert pickle.loads(pickle.dumps(fs)).how == how  # what the workers get
    rc = tune.RunConfig(name="torn", storage_path="results", storage_filesystem=fs, verbose=0,
                        failure_config=tune.FailureConfig(max_failures=0))
    # The sleep lets the driver take in each report before the next write can fail.
    results = tune.Tuner(counting, param_space={"iters": 6, "sleep": 0.2,
                                                "log": str(tmp_path / "starts.jsonl")},
                         run_config=rc).fit()
    trial_dir = tmp_path / "results" / "torn" / os.path.basename(results[0].path)
    return fs, results, trial_dir


def _committed(trial_dir) -> list[str]:
    return sorted(p.name for p in trial_dir.iterdir() if p.name.startswith("checkpoint_")
                  and (p / ".dasktune_checkpoint.json").exists())


def _logged(trial_dir) -> list[int]:
    return [json.loads(line)["training_iteration"] for line in open(trial_dir / "result.json")]


def _starts(tmp_path) -> list[int]:
    return [json.loads(line)["start"] for line in open(tmp_path / "starts.jsonl")]


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_torn_checkpoint_write_falls_back_to_previous(client, tmp_path, how):
    fs, results, trial_dir = _torn_run(tmp_path, how)
    torn = trial_dir / "checkpoint_000002"
    if how == "raise":
        # An errored trial's torn folder stays until a restore takes the trial up again.
        assert torn.is_dir() and not (torn / ".dasktune_checkpoint.json").exists()
        # A permanent storage error inside tune.report is the trial's error...
        assert len(results.errors) == 1 and results[0].metrics["it"] == 2
        assert tune.Tuner.can_restore("results/torn", storage_filesystem=fs)
        tuner = tune.Tuner.restore("results/torn", counting, resume_errored=True,
                                   storage_filesystem=fs)
        results = tuner.fit()  # ...and a restore continues from checkpoint 1 (it=2)
    else:
        (trial,) = results._trials
        # A lost host, not an error. (>= 1: the executor may first re-place the trial on
        # the dead worker before the scheduler has removed it; that attempt is lost at once.)
        assert trial.num_restarts >= 1 and trial.num_failures == 0
    assert not results.errors and results[0].metrics["it"] == 6
    assert _starts(tmp_path) == [1, 3]  # resumed right after the last valid checkpoint
    assert results[0].metrics["training_iteration"] == 6
    # The torn directory was deleted (by the retry, or the restore) and its name never
    # reused; the new lineage wrote fresh ones after it.
    assert not torn.exists()
    assert _committed(trial_dir) == ["checkpoint_000000", "checkpoint_000001",
                                     "checkpoint_000003", "checkpoint_000004",
                                     "checkpoint_000005", "checkpoint_000006"]
    assert _logged(trial_dir) == [1, 2, 3, 4, 5, 6]


def test_committed_but_unreported_checkpoint_is_resumed(client, tmp_path):
    """The worker dies after checkpoint 2 (it=3) is committed but before its report left:
    the restart must resume from it (storage is the truth), and it=3 is still logged."""
    _fs, results, trial_dir = _torn_run(tmp_path, "after-manifest")
    assert not results.errors and results[0].metrics["it"] == 6
    assert _logged(trial_dir) == [1, 2, 3, 4, 5, 6]
    assert _starts(tmp_path) == [1, 4]


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
