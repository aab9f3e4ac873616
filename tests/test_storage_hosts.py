"""A local storage path that some worker cannot see is refused by ``fit()``.

A worker with another ``--host`` alias still shares this machine's disk, so the marker
check would pass. Here one ``dask worker`` runs in its own mount namespace with a tmpfs
over the storage folder's parent: the driver's marker file is really invisible to it,
as on another host with a private disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

import dasktune as tune
from dasktune import runtime, tuner_build
from dasktune.storage import ExperimentStorage


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    if os.geteuid() != 0:
        return "mounting a tmpfs in a mount namespace needs root"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"unshare --mount failed: {probe.stderr.decode().strip()}"
    return None


_WHY = _can_unshare()
if _WHY and os.environ.get("CI"):
    raise RuntimeError(f"test_storage_hosts needs a private mount namespace in CI: {_WHY}")
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


def add_private_worker(procs, hidden: str) -> subprocess.Popen:
    """A ``dask worker`` that sees an empty tmpfs at ``hidden``."""
    worker = (f"exec {sys.executable} -m distributed.cli.dask_worker {procs.address} "
              "--nthreads 1 --no-dashboard --host 127.0.0.1 --resources CPU=1")
    log = open(os.path.join(procs.logdir, "private-worker.log"), "wb")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs dasktune-private {hidden} && {worker}"],
        env=procs.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    procs.workers.append(proc)  # killed by PID with the others
    return proc


def train(config):
    tune.report({"x": 1})


def test_private_local_path_is_refused(dask_processes, tmp_path, monkeypatch):
    hidden = tmp_path / "private"
    (hidden / "results").mkdir(parents=True)
    shared = tmp_path / "shared"
    procs = dask_processes(n_workers=1)
    add_private_worker(procs, str(hidden))
    procs.wait_workers(2)
    client = procs.client()
    try:
        private_addr = [a for a, ok in client.run(os.path.isdir, str(hidden / "results")).items()
                        if not ok]
        # a path both workers see passes: the check is about visibility, not addresses
        tuner_build.check_shared_storage(client, ExperimentStorage(str(shared), "exp"))
        with pytest.raises(ValueError) as info:
            tuner_build.check_shared_storage(
                client, ExperimentStorage(str(hidden / "results"), "exp"))
        msg = str(info.value)
        assert "cloud storage" in msg and "shared by every node" in msg
        assert len(private_addr) == 1 and private_addr[0] in msg

        # fit() refuses before any trial runs (the driver uses this cluster)
        monkeypatch.setattr(runtime, "_client", client)
        monkeypatch.setattr(runtime, "_cluster", None)
        rc = tune.RunConfig(name="exp", storage_path=str(hidden / "results"), verbose=0)
        with pytest.raises(ValueError, match="cloud storage"):
            tune.Tuner(train, run_config=rc).fit()
        exp = hidden / "results" / "exp"
        assert not any(p.name.startswith("train") for p in exp.iterdir())
        assert not any(p.name.startswith(".dasktune-marker") for p in exp.iterdir())
    finally:
        client.close()


def test_worker_joining_later_that_cannot_see_storage_gets_no_trials(
        dask_processes, tmp_path, monkeypatch, caplog):
    """A blind worker that joins mid-experiment is left out; the run goes on elsewhere."""
    hidden = tmp_path / "private"
    (hidden / "results").mkdir(parents=True)
    procs = dask_processes(n_workers=1)
    procs.wait_workers(1)
    client = procs.client()
    shared_worker = next(iter(client.scheduler_info()["workers"]))

    class JoinPrivateWorker(tune.Callback):
        """When the first trial starts, a blind worker joins (before the next trial)."""

        started = False

        def on_trial_start(self, iteration, trials, trial, **info):
            if not self.started:
                self.started = True
                add_private_worker(procs, str(hidden))
                procs.wait_workers(2)

    def steps(config):
        for i in range(3):
            time.sleep(0.05)
            tune.report({"i": i})

    try:
        monkeypatch.setattr(runtime, "_client", client)
        monkeypatch.setattr(runtime, "_cluster", None)
        rc = tune.RunConfig(name="late", storage_path=str(hidden / "results"), verbose=0,
                            callbacks=[JoinPrivateWorker()])
        with caplog.at_level("WARNING", logger="dasktune.execution.dask_executor"):
            results = tune.Tuner(steps, tune_config=tune.TuneConfig(num_samples=4),
                                 run_config=rc).fit()
        assert len(client.scheduler_info()["workers"]) == 2
        assert results.num_errors == 0 and results.num_terminated == 4
        assert {r.metrics["worker"] for r in results} == {shared_worker}
        assert all(r.metrics["training_iteration"] == 3 for r in results)
        assert any("cannot see the storage folder" in m for m in caplog.messages)
        exp = hidden / "results" / "late"
        assert not any(p.name.startswith(".dasktune-marker") for p in exp.iterdir())
    finally:
        client.close()
