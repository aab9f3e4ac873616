"""GPU placement and device isolation (issue 6) on real ``dask worker`` processes.

The workers advertise fake GPU counts (``--resources GPU=2,CPU=4``); nothing touches a real
GPU. What is checked is what CUDA would read: each trial reports the
``CUDA_VISIBLE_DEVICES`` of the process its code runs in. Trials that must overlap meet at
a file barrier in a shared folder, so "concurrent" is a fact, not a timing hope.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DaskProcesses, wait_for

import dasktune as tune

pytestmark = pytest.mark.slow


def probe(config: dict[str, Any]) -> None:
    """Report what this trial's process sees, once ``wait_for`` GPU trials of its group
    arrived (CPU-only trials wait for nobody)."""
    ctx = tune.get_context()
    group = os.path.join(config["dir"], config["group"] + ("" if config["gpu"] else "-cpu"))
    open(f"{group}-{ctx.get_trial_id()}", "w").close()
    deadline = time.monotonic() + 30
    while config["gpu"] and len(glob.glob(f"{group}-*")) < config["wait_for"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(glob.glob(group + '-*'))} trials of "
                               f"{config['group']!r} ever ran at once")
        time.sleep(0.02)
    gate = config.get("gate")
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        time.sleep(0.02)
    tune.report({"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
                 "ppid": os.getppid(),
                 "gpu_ids": ",".join(ctx.get_trial_resources()["gpu_ids"])})


def request(config: dict[str, Any]) -> dict[str, float]:
    return {"gpu": config["gpu"], "cpu": 1} if config["gpu"] else {"cpu": 1}


def fit(param_space: dict[str, Any], storage: str, name: str, **tc: Any) -> tune.ResultGrid:
    tuner = tune.Tuner(
        tune.with_resources(probe, request), param_space=param_space,
        tune_config=tune.TuneConfig(**tc),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    )
    return tuner.fit()


@pytest.fixture
def cluster(dask_processes) -> Iterator[Any]:
    """Factory: a scheduler plus workers with the given ``--resources``, dasktune connected."""

    def make(*resources: str) -> tuple[DaskProcesses, Any]:
        procs = dask_processes(n_workers=1, nthreads=2, resources=resources[0])
        for res in resources[1:]:
            procs.add_worker(nthreads=2, resources=res)
        procs.wait_workers(len(resources))
        tune.shutdown()  # leave any other cluster first
        return procs, tune.init(address=procs.address)

    yield make
    tune.shutdown()


def workers_by_resources(client: Any) -> dict[str, dict[str, float]]:
    return {a: w["resources"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}


def test_gpu_trials_get_own_devices_on_gpu_workers_only(cluster, tmp_path):
    procs, client = cluster("CPU=2", "GPU=2,CPU=4")
    gpu_worker = next(a for a, r in workers_by_resources(client).items() if r.get("GPU"))
    worker_pids = set(client.run(os.getpid).values())

    # Two whole-GPU trials that must run at once, and two CPU-only trials.
    space = {"gpu": tune.grid_search([1, 1, 0, 0]), "dir": str(tmp_path), "group": "whole",
             "wait_for": 2}
    results = fit(space, str(tmp_path / "res"), "whole")
    assert not results.errors, results.errors
    gpu = [r.metrics for r in results if r.config["gpu"]]
    cpu = [r.metrics for r in results if not r.config["gpu"]]
    assert {m["worker"] for m in gpu} == {gpu_worker}
    assert sorted(m["cvd"] for m in gpu) == ["0", "1"]  # distinct devices
    assert [m["gpu_ids"] for m in gpu] == [m["cvd"] for m in gpu]
    for m in gpu:  # each in a process of its own, started by the worker
        assert m["pid"] not in worker_pids and m["ppid"] in worker_pids
    assert len({m["pid"] for m in gpu}) == 2
    for m in cpu:  # in-thread, with no device
        assert m["cvd"] == "" and m["pid"] in worker_pids

    # Fractional: two 0.5-GPU trials at once share one device.
    space = {"gpu": 0.5, "dir": str(tmp_path), "group": "half", "wait_for": 2}
    results = fit(space, str(tmp_path / "res"), "half", num_samples=2)
    assert not results.errors, results.errors
    metrics = [r.metrics for r in results]
    assert {m["worker"] for m in metrics} == {gpu_worker}
    assert len({m["cvd"] for m in metrics}) == 1 and metrics[0]["cvd"] in {"0", "1"}
    assert len({m["pid"] for m in metrics}) == 2


def test_impossible_request_fails_fast(cluster, tmp_path):
    cluster("CPU=2")
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        fit({"gpu": 1, "dir": str(tmp_path), "group": "g", "wait_for": 1},
            str(tmp_path / "res"), "impossible")
    assert time.monotonic() - start < 20
    msg = str(info.value)
    assert "can never be placed" in msg and "GPU" in msg
    assert "workers offer" in msg and "CPU=2" in msg


def test_worker_joining_mid_experiment_gets_trials(cluster, tmp_path):
    procs, client = cluster("GPU=1,CPU=2")
    first = next(iter(workers_by_resources(client)))
    gate = str(tmp_path / "gate")
    space = {"gpu": 1, "dir": str(tmp_path), "group": "j", "wait_for": 1, "gate": gate}
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["results"] = fit(space, str(tmp_path / "res"), "elastic", num_samples=3)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    # One trial holds the only GPU (it waits at the gate); the other two wait for resources.
    wait_for(lambda: glob.glob(str(tmp_path / "j-*")), what="the first trial to start")
    procs.add_worker(nthreads=2, resources="GPU=1,CPU=2")
    procs.wait_workers(2)
    wait_for(lambda: len(glob.glob(str(tmp_path / "j-*"))) >= 2, timeout=30,
             what="a trial on the new worker")
    open(gate, "w").close()
    thread.join(120)
    assert not thread.is_alive(), "fit() did not finish"
    if "error" in out:
        raise out["error"]
    results = out["results"]
    assert not results.errors, results.errors
    workers = [r.metrics["worker"] for r in results]
    assert first in workers and len(set(workers)) == 2
    # Concurrent trials on two single-GPU workers: each sees its worker's only device.
    assert {r.metrics["cvd"] for r in results} == {"0"}
