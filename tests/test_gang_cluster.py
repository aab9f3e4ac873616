"""Gang placement on real ``dask scheduler`` / ``dask worker`` processes (issue 23).

Trials reserve several worker processes at once (``dasktune.session.reserve_workers``):
all or none, a distinct process per bundle, granted first come first served, with no
deadlock and no hand-tuned ``max_concurrent_trials``. Each trial writes one JSON line per
gang it held (when granted, when it ended) into a file the test reads; the assertions
are on those times and on the grants' worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
from conftest import read_jsonl, wait_for

# The fault tests' real-cluster fixture (no-nanny `dask worker` processes, killed by PID):
# the tests below take it as an argument, which ruff reads as a redefinition (F811).
from test_faults_workers import (
    cluster,  # noqa: F401
    join,
    run_in_thread,
)

import dasktune as tune
from dasktune.execution import EventKind
from dasktune.execution.dask_executor import DaskExecutor
from dasktune.execution.testing import wait_for_end
from dasktune.session import TrialSpec
from dasktune.shipping import dumps_trainable
from dasktune.storage import ExperimentStorage
from dasktune.tuner_build import ship_by_value

pytestmark = pytest.mark.slow

ONE = {"CPU": 1.0}
_ENDS = (EventKind.FINISHED, EventKind.LOST, EventKind.START_FAILED)


def _record(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def gang_trial(config: dict[str, Any]) -> None:
    """Reserve ``n`` single-CPU workers, note where and when, hold them ``hold`` s."""
    from distributed import get_client

    from dasktune.session import reserve_workers

    # Three bundles: the gang was reserved with the trial's start (Ray's convention).
    with_start = len(tune.get_context().get_trial_resources().bundles) == 1 + config["n"]
    asked = time.time()
    gang = reserve_workers([{"CPU": 1}] * config["n"], strategy="PACK")
    granted = time.time()
    pids = get_client().run(os.getpid, workers=gang.workers)
    time.sleep(config["hold"])
    _record(config["out"], {"trial": tune.get_context().get_trial_id(), "asked": asked,
                            "granted": granted, "end": time.time(), "workers": gang.workers,
                            "pids": sorted(pids.values()), "hosts": gang.hosts,
                            "pid": os.getpid(), "with_start": with_start})
    tune.report({"workers": len(set(gang.workers))})


def _shipped(fn: Any) -> bytes:
    """``fn`` as the driver ships a trainable (this module by value: workers cannot
    import it)."""
    ship_by_value(fn)
    return dumps_trainable(fn)


def _overlaps(rows: list[dict[str, Any]], start: str = "granted") -> list[tuple[str, str]]:
    spans = sorted((r[start], r["end"], r["trial"]) for r in rows)
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


def _fit(tmp_path, trainable: Any, n: int, hold: float, samples: int,
         timeout: float = 150.0) -> tuple[Any, list[dict[str, Any]]]:
    out = str(tmp_path / "gangs.jsonl")
    tuner = tune.Tuner(trainable, param_space={"n": n, "hold": hold, "out": out},
                       tune_config=tune.TuneConfig(num_samples=samples),
                       run_config=tune.RunConfig(storage_path=str(tmp_path / "results"),
                                                 name="gangs", verbose=0))
    thread, box = run_in_thread(tuner.fit)
    grid = join(thread, box, timeout)
    return grid, read_jsonl(out)


def test_a_gang_gets_distinct_worker_processes_and_each_slot_is_counted(cluster, tmp_path):  # noqa: F811
    procs = cluster(3)
    from dasktune import runtime

    executor = DaskExecutor(runtime._client)
    executor.watch_cluster()
    storage = ExperimentStorage(str(tmp_path / "results"), "gang-unit")
    out = str(tmp_path / "gangs.jsonl")
    spec = TrialSpec(trial_id="g1", trial_name="g1", experiment_name="gang-unit",
                     config={"n": 2, "hold": 1.0, "out": out},
                     trainable=_shipped(gang_trial), storage=storage,
                     trial_path=storage.trial_path("g1"))
    try:
        head = executor.place(ONE)
        executor.start(spec, dict(ONE), head)
        wanted = None
        deadline = time.monotonic() + 60
        while wanted is None and time.monotonic() < deadline:
            for event in executor.events(0.2):
                if event.kind is EventKind.WORKERS_WANTED:
                    wanted = event
                assert event.kind not in _ENDS, event
        assert wanted is not None and wanted.request is not None
        assert wanted.request.bundles == [ONE, ONE]
        # The waiting trial lent its own slot back: all three are free for the group.
        group = executor.place_gang(wanted.request.bundles, "PACK", head=ONE,
                                    head_worker=head)
        assert group is not None and group[0] == head and len(set(group)) == 3
        gang = executor.grant_workers("g1", wanted.request.bundles, "PACK", group[1:],
                                      wanted.request.request_id)
        assert executor.place(ONE) is None, "the head and both ranks must be counted"
        events = wait_for_end(executor, "g1", 60)
        assert events[-1].kind is EventKind.FINISHED and events[-1].error is None, events[-1]
        executor.release("g1")
        assert executor.place_gang([ONE] * 3) is not None, "the attempt's end frees its gang"
    finally:
        executor.shutdown()
    row, = read_jsonl(out)
    assert row["workers"] == gang.workers and len(set(row["workers"])) == 2
    assert len(set(row["pids"])) == 2 and head not in row["workers"]
    worker_pids = {p.pid for p in procs.workers}
    assert set(row["pids"]) <= worker_pids


def test_three_two_worker_trials_on_five_slots_all_finish_one_gang_at_a_time(cluster, tmp_path):  # noqa: F811
    cluster(5)
    grid, rows = _fit(tmp_path, gang_trial, n=2, hold=1.0, samples=3)
    assert grid.num_errors == 0 and len(grid) == 3
    assert sorted(r["trial"] for r in rows) == sorted(r.metrics["trial_id"] for r in grid)
    assert all(len(set(r["pids"])) == 2 for r in rows)
    # Head + 2 ranks each: two groups need 6 slots of the 5, so gangs never overlap.
    assert _overlaps(rows) == [], rows


def test_a_gang_the_cluster_can_never_offer_fails_fast_with_a_clear_error(cluster, tmp_path):  # noqa: F811
    cluster(3)

    def too_big(config: dict[str, Any]) -> None:
        from dasktune.session import reserve_workers

        t = time.monotonic()
        try:
            reserve_workers([{"CPU": 1}] * 5)
        except ValueError as exc:
            tune.report({"error": str(exc), "took": time.monotonic() - t})
            return
        tune.report({"error": "", "took": time.monotonic() - t})

    grid = tune.Tuner(too_big, run_config=tune.RunConfig(
        storage_path=str(tmp_path / "results"), name="too-big", verbose=0)).fit()
    metrics = grid[0].metrics
    assert "can never be placed" in metrics["error"], metrics
    assert "no 5 distinct workers" in metrics["error"] and "CPU=1" in metrics["error"]
    assert metrics["took"] < 5.0


def lose_a_rank(config: dict[str, Any]) -> None:
    """Reserve 2, say where, wait until one is lost, then reserve a fresh 2."""
    from dasktune.session import gang_lost, reserve_workers, wait_gang_lost

    gang = reserve_workers([{"CPU": 1}] * 2)
    _record(config["out"], {"phase": "granted", "workers": gang.workers})
    lost = wait_gang_lost(gang, timeout=90)
    again = reserve_workers([{"CPU": 1}] * 2, timeout=30)
    _record(config["out"], {"phase": "again", "lost": lost, "lost_after": gang_lost(gang),
                            "workers": again.workers})
    tune.report({"lost": len(lost)})


def test_a_lost_gang_worker_is_told_to_the_trial_and_frees_the_others(cluster, tmp_path):  # noqa: F811
    procs = cluster(4)
    out = str(tmp_path / "lost.jsonl")
    tuner = tune.Tuner(lose_a_rank, param_space={"out": out},
                       run_config=tune.RunConfig(storage_path=str(tmp_path / "results"),
                                                 name="lost", verbose=0))
    thread, box = run_in_thread(tuner.fit)
    first = wait_for(lambda: read_jsonl(out), 90, what="the gang's grant")[0]
    victim, survivor = first["workers"]
    from dasktune import runtime

    pid = runtime._client.run(os.getpid, workers=[victim])[victim]
    assert pid in {p.pid for p in procs.workers}
    os.kill(pid, signal.SIGKILL)
    grid = join(thread, box, 120)
    assert grid.num_errors == 0
    assert grid[0].metrics["lost"] == 1
    again = read_jsonl(out)[-1]
    assert again["phase"] == "again" and again["lost"] == [victim] == again["lost_after"]
    # Head + survivor + the fourth worker: the new gang needs the survivor's freed slot.
    assert survivor in again["workers"] and victim not in again["workers"]


def retire_a_rank(config: dict[str, Any]) -> None:
    """Reserve 2, say where, wait for the news that one retires, note whether it is still
    in the cluster then, give the gang back and reserve a fresh 2."""
    from distributed import get_client

    from dasktune.session import gang_lost, gang_retiring, release_workers, reserve_workers

    gang = reserve_workers([{"CPU": 1}] * 2)
    _record(config["out"], {"phase": "granted", "workers": gang.workers})
    deadline = time.monotonic() + 90
    while not gang_retiring(gang) and time.monotonic() < deadline:
        time.sleep(0.05)
    retiring = gang_retiring(gang)
    present = set(get_client().scheduler_info(n_workers=-1)["workers"])
    _record(config["out"], {"phase": "retiring", "retiring": retiring,
                            "present": [w for w in retiring if w in present],
                            "lost": gang_lost(gang)})
    release_workers(gang)
    again = reserve_workers([{"CPU": 1}] * 2, timeout=60)
    _record(config["out"], {"phase": "again", "workers": again.workers})
    tune.report({"retiring": len(retiring)})


@pytest.mark.parametrize("isolate", [False, True])
def test_a_retiring_gang_worker_is_news_and_retires_once_the_gang_is_released(
        cluster, tmp_path, isolate):  # noqa: F811
    import dask
    from distributed import Client

    procs = cluster(4)
    out = str(tmp_path / "retire.jsonl")
    with dask.config.set({"dasktune.executor.isolate": isolate}):
        tuner = tune.Tuner(retire_a_rank, param_space={"out": out},
                           run_config=tune.RunConfig(storage_path=str(tmp_path / "results"),
                                                     name="retire", verbose=0))
        thread, box = run_in_thread(tuner.fit)
        first = wait_for(lambda: read_jsonl(out), 90, what="the gang's grant")[0]
        victim = first["workers"][1]
        with Client(procs.address, set_as_default=False, timeout="20s") as client:
            client.retire_workers([victim], close_workers=True, remove=True)
            grid = join(thread, box, 120)
            wait_for(lambda: victim not in client.scheduler_info(n_workers=-1)["workers"],
                     timeout=30, what=f"{victim} to retire once its gang was released")
    assert grid.num_errors == 0, grid.errors
    heard, again = read_jsonl(out)[1:]
    # Told at once, while Dask held the retirement for the gang; not as a loss.
    assert heard == {"phase": "retiring", "retiring": [victim], "present": [victim],
                     "lost": []}
    assert victim not in again["workers"]


def test_the_driver_learns_the_gang_shape_and_starts_only_what_fits(cluster, tmp_path):  # noqa: F811
    cluster(5)
    grid, rows = _fit(tmp_path, gang_trial, n=2, hold=0.5, samples=7, timeout=240)
    assert grid.num_errors == 0 and len(rows) == 7
    # At most 5 trials (5 slots) started before the first one asked; every later one
    # started with its gang reserved.
    late = [r for r in rows if r["with_start"]]
    assert len(late) >= 2, rows
    # Started after the shape was known: its gang came with the start, no round trip...
    assert all(r["granted"] - r["asked"] < 0.05 for r in late), late
    # ...and head + 2 ranks of 5 slots: 5 // 3 = 1 such group at a time.
    assert _overlaps(rows) == [], rows
    assert _overlaps([{**r, "granted": r["asked"]} for r in late] +
                     [r for r in rows if r not in late]) == []


class _Scaling:
    """What ``dasktune.train.ScalingConfig`` gives ``with_resources``: Ray's bundles."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers

    def as_placement_group_factory(self) -> tune.PlacementGroupFactory:
        return tune.PlacementGroupFactory([{"CPU": 1}] + [{"CPU": 1}] * self.num_workers)


def test_a_gang_declared_up_front_is_reserved_with_every_trial(cluster, tmp_path):  # noqa: F811
    cluster(5)
    trainable = tune.with_resources(gang_trial, _Scaling(2))
    grid, rows = _fit(tmp_path, trainable, n=2, hold=0.5, samples=3)
    assert grid.num_errors == 0 and len(rows) == 3
    assert all(r["with_start"] and r["granted"] - r["asked"] < 0.05 for r in rows), rows
    assert _overlaps([{**r, "granted": r["asked"]} for r in rows]) == [], rows


def test_an_isolated_trial_reserves_its_gang_through_its_actor(cluster, tmp_path):  # noqa: F811
    import dask

    procs = cluster(3)
    with dask.config.set({"dasktune.executor.isolate": True}):
        grid, rows = _fit(tmp_path, gang_trial, n=2, hold=0.2, samples=1)
    assert grid.num_errors == 0, grid.errors
    row, = rows
    assert len(set(row["workers"])) == 2 and len(set(row["pids"])) == 2
    assert row["pid"] not in {p.pid for p in procs.workers}  # it ran in a child process


def test_a_lost_head_loses_the_trial_and_releases_its_gang(cluster, tmp_path):  # noqa: F811
    procs = cluster(3)
    from dasktune import runtime

    executor = DaskExecutor(runtime._client)
    executor.watch_cluster()
    storage = ExperimentStorage(str(tmp_path / "results"), "gang-head")
    out = str(tmp_path / "gangs.jsonl")
    spec = TrialSpec(trial_id="h1", trial_name="h1", experiment_name="gang-head",
                     config={"n": 2, "hold": 600.0, "out": out},
                     trainable=_shipped(gang_trial), storage=storage,
                     trial_path=storage.trial_path("h1"))
    try:
        group = executor.place_gang([ONE, ONE], "PACK", head=ONE)
        assert group is not None
        head = group[0]
        spec.gang = executor.grant_workers("h1", [ONE, ONE], "PACK", group[1:])
        executor.start(spec, dict(ONE), head)
        assert executor.place(ONE) is None  # head and gang reserved together
        pid = runtime._client.run(os.getpid, workers=[head])[head]
        assert pid in {p.pid for p in procs.workers}
        wait_for(lambda: any(e.kind is EventKind.STARTED for e in executor.events(0.2)),
                 60, what="the trial to start")
        os.kill(pid, signal.SIGKILL)
        ends: list[Any] = []

        def on_event(event: Any) -> None:
            if event.kind is EventKind.WORKER_LOST:
                ends.extend(executor.lose_worker(event.worker))  # as the driver does

        events = wait_for_end(executor, "h1", 60, on_event=on_event)
        assert events[-1].kind is EventKind.LOST, events[-1]
        executor.release("h1")
        # Both gang workers are free again: a new gang of two fits on them.
        assert sorted(executor.place_gang([ONE, ONE], "PACK") or []) == sorted(group[1:])
    finally:
        executor.shutdown()
