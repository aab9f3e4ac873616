"""Unit tests of the Dask executor and its cluster plugins on an in-process cluster
(``distributed.utils_test.gen_cluster``): real scheduler and workers on one event loop,
the executor's client on a thread of its own as in a driver. Each test asserts on the
events the executor emits."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

import cloudpickle
import dask.config
import pytest
from distributed import Client
from distributed.utils_test import gen_cluster

import dasktune as tune
from dasktune.execution import EventKind, ExecEvent, Report
from dasktune.execution.dask_executor import DaskExecutor
from dasktune.session import TrialSpec
from dasktune.storage import ExperimentStorage

# The executor's calls block on its client's loop, which needs the cluster's loop (this
# test's): they run on a thread (asyncio.to_thread), as they do on a driver's main thread.
_CLUSTER = dict(client=False, nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1)], timeout=90,
                clean_kwargs={"threads": False, "instances": False})


# Set when a test ends: the in-process workers' trial threads of long attempts (whose
# worker was removed, or whose attempt was fenced) stop, and leave no trial bound in this
# process for the tests after them.
_TEST_OVER = threading.Event()


@pytest.fixture(autouse=True)
def _end_long_attempts():
    _TEST_OVER.clear()
    yield
    _TEST_OVER.set()


def _steps(config):
    for i in range(config["n"]):
        if _TEST_OVER.is_set():
            return
        tune.report({"i": i})
        time.sleep(config.get("sleep", 0.0))


def _spec(tmp, trial_id: str, n: int, sleep: float = 0.0) -> TrialSpec:
    storage = ExperimentStorage(str(tmp), "unit")
    return TrialSpec(trial_id=trial_id, trial_name=trial_id, experiment_name="unit",
                     config={"n": n, "sleep": sleep}, trainable=cloudpickle.dumps(_steps),
                     storage=storage, trial_path=storage.trial_path(trial_id))


async def _open(scheduler) -> tuple[Client, DaskExecutor]:
    client = await asyncio.to_thread(Client, scheduler.address)
    executor = DaskExecutor(client)
    assert await asyncio.to_thread(executor.watch_cluster)
    return client, executor


async def _close(client: Client, executor: DaskExecutor) -> None:
    await asyncio.to_thread(executor.shutdown)
    await asyncio.to_thread(client.close)


async def _events_until(executor: DaskExecutor, done, timeout: float = 30.0
                        ) -> list[ExecEvent]:
    """Events (taken as the driver takes them) until ``done(events)`` holds."""
    got: list[ExecEvent] = []
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"timed out; events so far: {got}"
        got += await asyncio.to_thread(executor.events, 0.1)
    return got


def _ended(tid: str):
    return lambda got: any(e.trial_id == tid and e.kind in (
        EventKind.FINISHED, EventKind.LOST) for e in got)


@gen_cluster(**_CLUSTER)
async def test_an_attempt_starts_reports_and_finishes(s, a, b):
    client, executor = await _open(s)
    try:
        worker = await asyncio.to_thread(executor.place, {"CPU": 1.0})
        assert worker in (a.address, b.address)
        with tempfile.TemporaryDirectory() as tmp:
            await asyncio.to_thread(executor.start, _spec(tmp, "t1", 3), {"CPU": 1.0}, worker)
            assert executor.running_on(worker) == ["t1"]
            events = await _events_until(executor, _ended("t1"))
        kinds = [e.kind for e in events]
        assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.FINISHED, kinds
        assert events[0].worker == worker and events[0].host
        assert set(kinds[1:-1]) <= {EventKind.REPORTS}
        reports = [r for e in events for r in e.reports]
        assert all(isinstance(r, Report) for r in reports)
        assert [r.result["i"] for r in reports] == [0, 1, 2]
        assert events[-1].error is None
        # One slot each: the busy worker is not chosen until the attempt is released.
        assert await asyncio.to_thread(executor.place, {"CPU": 1.0}) != worker
        await asyncio.to_thread(executor.release, "t1")
        assert executor.num_running == 0 and executor.running_on(worker) == []
    finally:
        await _close(client, executor)


@gen_cluster(**_CLUSTER)
async def test_a_fast_reporting_attempt_sends_its_reports_in_batches(s, a, b):
    """A report every 5 ms: replies come at most 20 a second (the default
    executor.report-batches-per-second, one trial running), each with the reports made
    since, none lost or reordered."""
    client, executor = await _open(s)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await asyncio.to_thread(executor.start, _spec(tmp, "t5", 200, sleep=0.005),
                                    {"CPU": 1.0}, a.address)
            events = await _events_until(executor, _ended("t5"))
        batches = [e.reports for e in events if e.reports]
        reports = [r.result for batch in batches for r in batch]
        assert [r["i"] for r in reports] == list(range(200))
        # At most one reply per 50 ms of the trial's run, plus its first and its end.
        span = reports[-1]["time_total_s"] - reports[0]["time_total_s"]
        assert len(batches) <= 2 + span / 0.05, ([len(b) for b in batches], span)
        assert len(batches) < 200 / 4
    finally:
        await _close(client, executor)


@gen_cluster(**_CLUSTER)
async def test_a_report_rate_of_zero_is_refused_before_anything_runs(s, a, b):
    client = await asyncio.to_thread(Client, s.address)
    try:
        with dask.config.set({"dasktune.executor.report-batches-per-second": 0}), \
                pytest.raises(ValueError, match="report-batches-per-second must be > 0"):
            DaskExecutor(client)
    finally:
        await asyncio.to_thread(client.close)


@gen_cluster(**_CLUSTER)
async def test_a_removed_worker_is_reported_and_its_attempt_lost(s, a, b):
    client, executor = await _open(s)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await asyncio.to_thread(executor.start, _spec(tmp, "t2", 100_000, sleep=0.01),
                                    {"CPU": 1.0}, a.address)
            await _events_until(executor, lambda got: any(
                e.kind is EventKind.STARTED for e in got))
            await s.remove_worker(address=a.address, stimulus_id="test-remove")
            events = await _events_until(executor, lambda got: any(
                e.kind is EventKind.WORKER_LOST for e in got))
            lost = [e for e in events if e.kind is EventKind.WORKER_LOST]
            assert [e.worker for e in lost] == [a.address]
            # The driver's answer to WORKER_LOST: every attempt there ends LOST.
            if not _ended("t2")(events):
                assert await asyncio.to_thread(executor.lose_worker, a.address) == ["t2"]
                events += await _events_until(executor, _ended("t2"))
        end = [e for e in events if e.trial_id == "t2"][-1]
        assert end.kind is EventKind.LOST and end.error, end
        await asyncio.to_thread(executor.release, "t2")
        # The lost worker is placed on no more.
        assert await asyncio.to_thread(executor.place, {"CPU": 1.0}) == b.address
    finally:
        await _close(client, executor)


@gen_cluster(**_CLUSTER)
async def test_the_fence_stops_an_attempt_whose_task_left_the_worker(s, a, b):
    """The scheduler drops the driver's hold on the actor's task (as when the driver's
    client is gone): the worker's fence plugin stops the attempt at its next report,
    and the executor, whose actor is gone, reports the attempt lost."""
    client, executor = await _open(s)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            await asyncio.to_thread(executor.start, _spec(tmp, "t3", 100_000, sleep=0.01),
                                    {"CPU": 1.0}, a.address)
            await _events_until(executor, lambda got: any(
                e.kind is EventKind.STARTED for e in got))
            key = "dasktune-t3-1"
            actor = a.state.actors[key]
            s.client_releases_keys(keys=[key], client=client.id, stimulus_id="test-fence")
            events = await _events_until(executor, _ended("t3"))
            assert actor.fenced_reason is not None and key in actor.fenced_reason
            deadline = time.monotonic() + 10
            while actor._thread.is_alive():  # the trial's thread stops at its next report
                assert time.monotonic() < deadline, "the fenced attempt ran on"
                await asyncio.sleep(0.02)
        end = [e for e in events if e.trial_id == "t3"][-1]
        assert end.kind is EventKind.LOST, end
        await asyncio.to_thread(executor.release, "t3")
    finally:
        await _close(client, executor)
