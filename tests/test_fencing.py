"""Zombie fencing (issue 4): a trial whose driver is gone stops at once, not after
``dasktune.executor.orphan-timeout``.

A driver process (its own process group) runs one long trial on a separate ``dask
worker`` process and is SIGKILLed mid-trial. The scheduler drops the dead client and
releases its actor's task; the worker's :class:`~dasktune.execution.recovery.FencePlugin` sees the
task leave and stops the trial at its next report. The orphan timeout is set to 60 s on
the cluster, so only the fence can stop it within the test's bound. The trainable keeps
side records in its trial folder (``executed.jsonl`` per iteration, ``stopped.jsonl``
when its code exits); the test waits on those, never on sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import cloudpickle
import pytest
from conftest import wait_for

import dasktune as tune
from dasktune import runtime
from dasktune.execution import recovery
from dasktune.storage import MANIFEST
from dasktune.trial import TERMINATED

pytestmark = pytest.mark.slow
# The probes below run on the workers through client.run; they cannot import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Seconds from the driver's SIGKILL to the trial's code exiting: far below the 60 s
# orphan timeout set below (and the 15 s default).
FENCE_BOUND_S = 2.0
ORPHAN_ENV = {"DASK_DASKTUNE__EXECUTOR__ORPHAN_TIMEOUT": "60s"}

DRIVER = r'''
import json, os, shutil, sys, tempfile, time
import dasktune as tune

address, storage, name, kind = sys.argv[1:5]

def _append(d, fname, rec):
    with open(os.path.join(d, fname), "a") as f:
        f.write(json.dumps(rec) + "\n")

def train(config):
    d = tune.get_context().get_trial_dir()
    try:
        for i in range(1, 100000):
            time.sleep(0.1)
            _append(d, "executed.jsonl", {"it": i, "t": time.time()})
            ck = tmp = None
            if i % 2 == 0:
                tmp = tempfile.mkdtemp()
                with open(os.path.join(tmp, "s.json"), "w") as f:
                    json.dump({"i": i}, f)
                ck = tune.Checkpoint.from_directory(tmp)
            tune.report({"i": i}, checkpoint=ck)
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        _append(d, "stopped.jsonl", {"t": time.time()})

class Train(tune.Trainable):
    def setup(self, config):
        self.i, self.d = 0, tune.get_context().get_trial_dir()

    def step(self):
        time.sleep(0.1)
        self.i += 1
        _append(self.d, "executed.jsonl", {"it": self.i, "t": time.time()})
        return {"i": self.i}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "s.json"), "w") as f:
            json.dump({"i": self.i}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "s.json")) as f:
            self.i = json.load(f)["i"]

    def cleanup(self):
        _append(self.d, "stopped.jsonl", {"t": time.time()})

tune.init(address=address)
# The class trial also asks for a checkpoint at its end: a fenced one must not write it.
tuner = tune.Tuner(
    train if kind == "function" else Train,
    run_config=tune.RunConfig(
        name=name, storage_path=storage, verbose=0,
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=0 if kind == "function" else 2,
            checkpoint_at_end=kind == "class")))
tuner.fit()
'''


def _jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f.read().splitlines() if line.endswith("}")]
    except FileNotFoundError:
        return []


def _checkpoints(trial_dir: str) -> dict[str, float | None]:
    """Every checkpoint folder of the trial -> its commit time (None: no manifest)."""
    out: dict[str, float | None] = {}
    for name in os.listdir(trial_dir):
        if name.startswith(("checkpoint_", ".tmp_checkpoint_")):
            path = os.path.join(trial_dir, name, MANIFEST)
            try:
                with open(path) as f:
                    out[name] = float(json.load(f)["committed_at"])
            except (OSError, ValueError):
                out[name] = None
    return out


def _trial_threads(dask_worker: Any) -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("dasktune-trial-")]


def _trial_actors(dask_worker: Any) -> list[str]:
    return [str(k) for k in dask_worker.state.actors]


@pytest.mark.parametrize("kind", ["function", "class"])
def test_killed_driver_stops_its_trial_at_once(dask_processes, tmp_path, kind):
    procs = dask_processes(n_workers=1, env=ORPHAN_ENV)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "fence"
    exp = os.path.join(storage, name)
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([sys.executable, str(script), procs.address, storage, name, kind],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              cwd=str(tmp_path))
    client = procs.client()
    try:
        def trial_dir() -> str | None:
            dirs = [os.path.join(exp, d) for d in os.listdir(exp)] if os.path.isdir(exp) else []
            return next((d for d in dirs if os.path.isdir(d)), None)

        d = wait_for(trial_dir, timeout=60, what="the trial folder")
        assert isinstance(d, str)
        wait_for(lambda: len(_jsonl(os.path.join(d, "executed.jsonl"))) >= 5 and any(
            _checkpoints(d).values()), timeout=60, what="5 iterations and a checkpoint")
        t_kill = time.time()
        os.killpg(driver.pid, signal.SIGKILL)  # the whole driver, as a crash would
        driver.wait(10)

        stopped = wait_for(lambda: _jsonl(os.path.join(d, "stopped.jsonl")), timeout=30,
                           what="the trial's code to exit")
        assert isinstance(stopped, list)
        stop_s = stopped[0]["t"] - t_kill
        # Its thread ended and the worker dropped the actor: nothing can write any more.
        wait_for(lambda: not any(client.run(_trial_threads).values()), timeout=10,
                 what="the trial thread to end")
        assert not any(client.run(_trial_actors).values())
        executed = _jsonl(os.path.join(d, "executed.jsonl"))
        after = [r for r in executed if r["t"] > t_kill]
        ckpts = _checkpoints(d)
        print(f"\n{kind}: trial stopped {stop_s:.3f}s after the driver's SIGKILL "
              f"(orphan-timeout 60s); {len(after)} iteration(s) after the kill")
        assert 0 <= stop_s < FENCE_BOUND_S
        assert len(after) <= 2  # the iteration in flight, then the next report stops it
        assert all(r["t"] <= stopped[0]["t"] for r in executed)
        # Nothing committed after it was fenced, and no half-written folder left over.
        assert all(t is not None for t in ckpts.values()), ckpts
        late = [n for n, t in ckpts.items() if t is not None and t > t_kill]
        assert len(late) <= 1, late  # at most the one whose report was already in flight
        if kind == "class":  # checkpoint_at_end: not written by a fenced attempt
            assert all(t is not None and t < stopped[0]["t"] for t in ckpts.values())
    finally:
        client.close()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
        log.close()


def _short(config: dict[str, Any]) -> None:
    d = tune.get_context().get_trial_dir()
    with open(os.path.join(d, "attempts.jsonl"), "a") as f:
        f.write(json.dumps({"pid": os.getpid()}) + "\n")
    for i in range(1, config["iters"] + 1):
        time.sleep(0.02)
        tune.report({"i": i}, checkpoint=None)


def test_normal_fit_unaffected_by_the_fence(dask_processes, tmp_path, monkeypatch):
    """More trials than slots (pooled actors are reused across trials): every trial runs
    once, to the end; the fence plugin is installed on every worker."""
    from distributed import Client

    procs = dask_processes(n_workers=2, env=ORPHAN_ENV)
    client = Client(procs.address, set_as_default=False)
    monkeypatch.setattr(runtime, "_client", client)
    monkeypatch.setattr(runtime, "_cluster", None)
    try:
        results = tune.Tuner(
            _short, param_space={"x": tune.grid_search(list(range(6))), "iters": 10},
            run_config=tune.RunConfig(name="normal", storage_path=str(tmp_path / "results"),
                                      verbose=0)).fit()
        installed = client.run(lambda dask_worker: recovery.FENCE_PLUGIN_NAME
                               in dask_worker.plugins)
        assert list(installed.values()) == [True, True]
        assert [t.status for t in results._trials] == [TERMINATED] * 6
        assert all(t.num_failures == 0 and t.num_restarts == 0 for t in results._trials)
        for r in results:
            assert r.metrics["training_iteration"] == 10
            with open(os.path.join(r.path, "attempts.jsonl")) as f:
                assert len(f.read().splitlines()) == 1  # one attempt: none was fenced
    finally:
        client.close()


@pytest.mark.parametrize("where", ["local", "memory"])
def test_fenced_attempt_commits_no_checkpoint(tmp_path, where):
    """A fence that lands while a checkpoint uploads: the files are removed and the
    manifest never written, so a restore cannot pick the zombie's checkpoint up; the
    trial's code gets StopTrial from tune.report."""
    from dasktune.checkpoint import Checkpoint
    from dasktune.session import StopTrial, TrialSession, TrialSpec
    from dasktune.storage import CommitFenced, ExperimentStorage

    root = str(tmp_path) if where == "local" else f"memory://fence-{os.getpid()}"
    storage = ExperimentStorage(root, "exp")
    trial_path = storage.trial_path("t0")
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "weights.bin").write_bytes(b"x" * 1000)

    with pytest.raises(CommitFenced):
        storage.commit_checkpoint(str(local), trial_path, 0, {"training_iteration": 1},
                                  fenced=lambda: True)
    assert not storage.fs.exists(f"{trial_path}/checkpoint_000000")

    spec = TrialSpec(trial_id="t0", trial_name="t0", experiment_name="exp", config={},
                     trainable=None, storage=storage, trial_path=trial_path)
    fenced = [False]
    emitted: list = []
    session = TrialSession(spec, lambda r, p: emitted.append((r, p)), lambda *a: False,
                           fenced=lambda: fenced[0])
    session.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(str(local)))
    committed = emitted[-1][1]
    assert committed and storage.is_committed(committed)
    fenced[0] = True
    with pytest.raises(StopTrial):
        session.report({"loss": 0.5}, checkpoint=Checkpoint.from_directory(str(local)))
    assert len(emitted) == 1  # the fenced result went nowhere
    names = [p.rsplit("/", 1)[-1] for p in storage.fs.ls(trial_path, detail=False)]
    assert [n for n in names if n.startswith("checkpoint_")] == [committed.rsplit("/", 1)[-1]]
