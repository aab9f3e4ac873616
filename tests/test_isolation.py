"""Trials in processes of their own (``dasktune.isolation``), on real ``dask worker`` processes.

GPU trials (fake ``GPU=2`` workers) and, with ``dasktune.executor.isolate``, every trial
run in a child of the worker: both trainable APIs, checkpoints committed from the child
and restored into a new one, errors and crashes, stop requests relayed down, and no child
outliving its worker.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from conftest import DaskProcesses, wait_for

import dasktune as tune
from dasktune.child_process import child_env
from dasktune.isolation import STOP_GRACE_S, child_devices

pytestmark = pytest.mark.slow

GPU = {"gpu": 1, "cpu": 1}


def facts() -> dict[str, Any]:
    return {"pid": os.getpid(), "ppid": os.getppid(),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_", "unset"),
            "omp": os.environ.get("OMP_NUM_THREADS")}


def resumable(config: dict[str, Any]) -> None:
    """Checkpoints every step; its first attempt fails after step 2, the retry resumes."""
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["i"] + 1
    for i in range(start, 4):
        d = os.path.join(tune.get_context().get_trial_dir(), f"ckpt_{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"i": i}, f)
        tune.report({"i": i, "start": start, **facts()},
                    checkpoint=tune.Checkpoint.from_directory(d))
        if i == 2 and tune.get_context().get_attempt() == 1:
            raise RuntimeError("first attempt fails on purpose")


class Counter(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.count = 0

    def step(self) -> dict[str, Any]:
        self.count += 1
        return {"count": self.count, **facts()}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "c.json"), "w") as f:
            json.dump({"count": self.count}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "c.json")) as f:
            self.count = json.load(f)["count"]


def failing(config: dict[str, Any]) -> None:
    tune.report({"x": 1})
    if config["how"] == "exit":
        os._exit(3)
    raise ZeroDivisionError("boom in the child")


def endless(config: dict[str, Any]) -> None:
    with open(os.path.join(config["dir"], f"pid-{os.getpid()}"), "w"):
        pass
    i = 0
    while True:
        i += 1
        tune.report({"i": i, "attempt": tune.get_context().get_attempt(), **facts()})
        threading.Event().wait(0.02)  # bounded report rate: the driver stays responsive


def stuck(config: dict[str, Any]) -> None:
    """Reports once, then never reaches another report: only termination ends it."""
    with open(os.path.join(config["dir"], f"stuck-{os.getpid()}"), "w"):
        pass
    tune.report({"i": 1})
    threading.Event().wait(120)


def run(trainable: Any, storage: str, name: str, resources: dict[str, float] = GPU,
        **kw: Any) -> tune.ResultGrid:
    tc = tune.TuneConfig(**kw.pop("tc", {}))
    return tune.Tuner(
        tune.with_resources(trainable, resources), param_space=kw.pop("space", {}),
        tune_config=tc, run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                  **kw),
    ).fit()


@pytest.fixture
def gpu_cluster(dask_processes) -> Iterator[Any]:
    """One ``GPU=2,CPU=4`` worker that isolates every trial; dasktune connected."""
    procs = dask_processes(n_workers=1, nthreads=2, resources="GPU=2,CPU=4",
                           env={"DASK_DASKTUNE__EXECUTOR__ISOLATE": "True"})
    tune.shutdown()  # leave any other cluster first
    client = tune.init(address=procs.address)
    yield procs, client, set(client.run(os.getpid).values())
    tune.shutdown()


def test_child_runs_function_and_class_trainables_with_checkpoints(gpu_cluster, tmp_path):
    _, _, worker_pids = gpu_cluster
    storage = str(tmp_path / "res")

    results = run(resumable, storage, "fn",
                  failure_config=tune.FailureConfig(max_failures=1))
    (res,) = results
    assert not results.errors, results.errors
    rows = res.metrics_dataframe.to_dict("records")
    assert [r["i"] for r in rows] == [0, 1, 2, 3] and rows[-1]["start"] == 3
    assert len({r["pid"] for r in rows}) == 2  # the retry ran in a new child
    assert all(r["pid"] not in worker_pids and r["ppid"] in worker_pids for r in rows)
    assert res.metrics["cvd"] == "0"  # (the dataframe reads it back as a number)
    # The worker's malloc tuning by Dask's nanny is the worker's alone; the child's math
    # libraries get the CPUs it reserved (1 here).
    assert res.metrics["malloc_trim"] == "unset" and res.metrics["omp"] == "1"
    with res.checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        assert json.load(f) == {"i": 3}

    results = run(Counter, storage, "cls", stop={"training_iteration": 4},
                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))
    (res,) = results
    assert not results.errors, results.errors
    assert res.metrics["count"] == 4 and res.metrics["pid"] not in worker_pids
    with res.checkpoint.as_directory() as d, open(os.path.join(d, "c.json")) as f:
        assert json.load(f) == {"count": 4}

    # isolate=True on this worker: a CPU-only trial gets a child too, with no device,
    # and as many math-library threads as CPUs it reserved (Dask's worker has 1).
    results = run(Counter, storage, "cpu", resources={"cpu": 3}, stop={"training_iteration": 1})
    (res,) = results
    assert res.metrics["pid"] not in worker_pids and res.metrics["cvd"] == ""
    assert res.metrics["omp"] == "3"


def test_child_errors_and_crashes_become_trial_errors(gpu_cluster, tmp_path):
    results = run(failing, str(tmp_path / "res"), "fail",
                  space={"how": tune.grid_search(["exit", "raise"])})
    assert results.num_errors == 2
    by_how = {r.config["how"]: str(r.error) for r in results}
    assert "exited with code 3" in by_how["exit"]
    assert "ZeroDivisionError: boom in the child" in by_how["raise"]
    assert all(r.metrics["x"] == 1 for r in results)  # the report before the failure arrived


def test_stop_is_relayed_and_the_child_ends(gpu_cluster, tmp_path):
    def stop_at_5(trial_id: str, result: dict[str, Any]) -> bool:  # evaluated by the driver
        return result["i"] >= 5

    results = run(endless, str(tmp_path / "res"), "stop", stop=stop_at_5,
                  space={"dir": str(tmp_path)})
    (res,) = results
    assert not results.errors and res.metrics["i"] >= 5
    (marker,) = [n for n in os.listdir(tmp_path) if n.startswith("pid-")]
    pid = int(marker.split("-")[1])
    wait_for(lambda: gone(pid), timeout=15, what=f"trial process {pid} to exit")

    # A child that never reports again is terminated STOP_GRACE_S after the stop.
    start = time.monotonic()
    results = run(stuck, str(tmp_path / "res"), "stuck", stop=lambda tid, result: True,
                  space={"dir": str(tmp_path)})
    assert not results.errors and time.monotonic() - start < STOP_GRACE_S + 15
    (marker,) = [n for n in os.listdir(tmp_path) if n.startswith("stuck-")]
    wait_for(lambda: gone(int(marker.split("-")[1])), timeout=15, what="the stuck child to exit")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_child_dies_with_its_worker(dask_processes, tmp_path):
    procs: DaskProcesses = dask_processes(n_workers=1, resources="CPU=1")
    # Two no-nanny GPU workers: the PID we kill is the worker process itself.
    gpu_workers = {w.pid: w for w in
                   (procs.add_worker("--no-nanny", resources="GPU=1,CPU=1") for _ in range(2))}
    procs.wait_workers(3)
    tune.shutdown()  # leave any other cluster first
    tune.init(address=procs.address)
    out: dict[str, Any] = {}

    def target() -> None:
        out["results"] = run(endless, str(tmp_path / "res"), "orphan",
                             space={"dir": str(tmp_path)},
                             stop=lambda tid, result: result["attempt"] >= 2)

    try:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        marker = wait_for(lambda: [n for n in os.listdir(tmp_path) if n.startswith("pid-")],
                          what="the trial process to start")
        pid = int(marker[0].split("-")[1])
        host = psutil.Process(pid).ppid()
        assert host in gpu_workers
        os.kill(host, signal.SIGKILL)
        wait_for(lambda: gone(pid), timeout=15, what=f"orphaned trial process {pid} to exit")
        thread.join(60)  # the retry runs on the other worker and is stopped there
        assert not thread.is_alive()
        (res,) = out["results"]
        assert res.metrics["attempt"] == 2 and res.metrics["ppid"] != host
    finally:
        tune.shutdown()


def test_child_devices_maps_worker_ordinals():
    assert child_devices(["0", "1"], None) == ["0", "1"]
    assert child_devices(["1"], ["3", "5"]) == ["5"]
    assert child_devices(["GPU-abc"], ["3"]) == ["GPU-abc"]


def test_child_env_replaces_only_what_the_nanny_set_for_its_worker(monkeypatch):
    import dask

    nanny = {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1}
    for key, value in nanny.items():  # the worker's environment, as Dask's nanny sets it
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": nanny}):
        env = child_env(["1"])  # no CPU count: the thread caps stay
        assert "MALLOC_TRIM_THRESHOLD_" not in env and "OPENBLAS_NUM_THREADS" not in env
        assert (env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "1")
        env = child_env([], cpus=2.5)
        assert [env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                 "OPENBLAS_NUM_THREADS")] == ["2", "2", "2"]
        assert child_env([], cpus=0.5)["OMP_NUM_THREADS"] == "1"
        # The user's own values are theirs.
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
        monkeypatch.setenv("OMP_NUM_THREADS", "4")
        env = child_env([], cpus=2)
        assert (env["MALLOC_TRIM_THRESHOLD_"], env["OMP_NUM_THREADS"]) == ("131072", "4")
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {}}):
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
        assert child_env([])["MALLOC_TRIM_THRESHOLD_"] == "65536"
