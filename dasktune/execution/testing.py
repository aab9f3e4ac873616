"""A conformance kit for :class:`~dasktune.execution.protocol.Executor` implementations.

:func:`check_executor` plays the driver's side of the contract against a fresh executor
and asserts what every executor must do, whatever runs the trials: events of the right
kinds for the attempt they name, reports in order as :class:`Report` values, one end per
attempt, resources free again after :meth:`~Executor.release`, a stop and a lost worker
each ending the attempt, and gangs placed all or none on distinct workers, given back by
:meth:`~Executor.release_gang`. The Dask and the simulated executors both pass it
(``tests/test_executor_conformance.py``); so can a user's own executor.

The caller supplies ``make_spec(trial_id, n)``: the :class:`~dasktune.session.TrialSpec`
of a trial that reports ``{"i": 0}`` ... ``{"i": n - 1}`` and returns, taking long
enough per report (for a real executor, about 10 ms) that a stop lands while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dasktune.execution.protocol import EventKind, ExecEvent, Executor, Report

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["check_executor", "wait_for_end"]

_ENDS = (EventKind.FINISHED, EventKind.LOST, EventKind.START_FAILED)
_ONE_CPU = {"CPU": 1.0}


def wait_for_end(executor: Executor, trial_id: str, timeout: float = 60.0,
                 on_event: Callable[[ExecEvent], None] | None = None) -> list[ExecEvent]:
    """The events of ``trial_id`` up to and including its end (FINISHED, LOST or
    START_FAILED); other events go to ``on_event``. AssertionError after ``timeout``."""
    got: list[ExecEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in executor.events(0.2):
            if event.trial_id != trial_id:
                if on_event is not None:
                    on_event(event)
                continue
            got.append(event)
            if event.kind in _ENDS:
                return got
    raise AssertionError(f"trial {trial_id} did not end within {timeout}s: {got}")


def _start(executor: Executor, spec: TrialSpec) -> str:
    worker = executor.place(_ONE_CPU)
    assert worker is not None, "no worker can take a 1-CPU trial"
    assert worker in executor.workers()
    executor.start(spec, dict(_ONE_CPU), worker)
    assert executor.num_running == 1
    assert spec.trial_id in executor.running_on(worker)
    return worker


def _wait_started(executor: Executor, trial_id: str, timeout: float = 60.0) -> ExecEvent:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in executor.events(0.2):
            if event.trial_id == trial_id:
                assert event.kind is EventKind.STARTED, event
                return event
    raise AssertionError(f"trial {trial_id} did not start within {timeout}s")


def check_executor(executor: Executor, make_spec: Callable[[str, int], TrialSpec],
                   timeout: float = 60.0) -> None:
    """Run the conformance checks on ``executor`` (which has at least one worker with a
    free CPU and runs nothing yet); shuts it down at the end."""
    assert isinstance(executor, Executor), f"{type(executor).__name__} is not an Executor"
    try:
        _check_placement(executor)
        _check_a_trial_runs_to_its_end(executor, make_spec, timeout)
        _check_stop(executor, make_spec, timeout)
        _check_lost_worker(executor, make_spec, timeout)
        _check_queueing(executor, make_spec)
        _check_gangs(executor)
    finally:
        executor.shutdown()


def _check_placement(executor: Executor) -> None:
    workers = executor.workers()
    assert workers, "the executor has no workers"
    assert all("host" in info for info in workers.values())
    assert executor.can_ever_fit(_ONE_CPU) is None
    why = executor.can_ever_fit({"CPU": 1e9})
    assert isinstance(why, str) and why, "an impossible request must say why"
    assert executor.place({"CPU": 1e9}) is None
    assert executor.num_running == 0


def _check_a_trial_runs_to_its_end(executor: Executor,
                                   make_spec: Callable[[str, int], TrialSpec],
                                   timeout: float) -> None:
    spec = make_spec("conf-run", 3)
    worker = _start(executor, spec)
    events = wait_for_end(executor, spec.trial_id, timeout)
    assert [e.attempt for e in events] == [spec.attempt] * len(events)
    assert events[0].kind is EventKind.STARTED and events[0].worker == worker, events[0]
    assert all(e.kind in (EventKind.REPORTS, EventKind.FINISHED) for e in events[1:]), events
    end = events[-1]
    assert end.kind is EventKind.FINISHED and end.error is None, end
    reports = [r for e in events for r in e.reports]
    assert all(isinstance(r, Report) for r in reports)
    seqs = [r.seq for r in reports]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert [r.result["i"] for r in reports if r.result is not None] == [0, 1, 2]
    assert all(r.result["training_iteration"] == k + 1
               for k, r in enumerate(r for r in reports if r.result is not None))
    executor.release(spec.trial_id)
    executor.release(spec.trial_id)  # idempotent
    assert executor.num_running == 0
    assert spec.trial_id not in executor.running_on(worker)
    assert executor.place(_ONE_CPU) is not None, "release must free the trial's resources"


def _check_stop(executor: Executor, make_spec: Callable[[str, int], TrialSpec],
                timeout: float) -> None:
    spec = make_spec("conf-stop", 100_000)
    _start(executor, spec)
    _wait_started(executor, spec.trial_id, timeout)
    executor.stop(spec.trial_id)
    events = wait_for_end(executor, spec.trial_id, timeout)
    assert events[-1].kind is EventKind.FINISHED and events[-1].error is None, events[-1]
    n = sum(1 for e in events for r in e.reports if r.result is not None)
    assert n < 100_000, "a stopped trial ran to its end"
    executor.release(spec.trial_id)
    assert executor.num_running == 0


def _check_lost_worker(executor: Executor, make_spec: Callable[[str, int], TrialSpec],
                       timeout: float) -> None:
    spec = make_spec("conf-lost", 100_000)
    worker = _start(executor, spec)
    _wait_started(executor, spec.trial_id, timeout)
    assert executor.lose_worker(worker) == [spec.trial_id]
    events = wait_for_end(executor, spec.trial_id, timeout)
    assert events[-1].kind is EventKind.LOST and events[-1].error, events[-1]
    assert worker in events[-1].error
    executor.release(spec.trial_id)
    assert executor.num_running == 0


def _check_queueing(executor: Executor, make_spec: Callable[[str, int], TrialSpec]) -> None:
    # Nothing runs: there is nothing to queue behind, whatever the executor can do.
    assert executor.queue_after("conf-none", make_spec("conf-queued", 1)) is False
    executor.unqueue("conf-queued")  # a no-op for an attempt never queued
    assert isinstance(executor.can_queue, bool)


def _check_gangs(executor: Executor) -> None:
    n = len(executor.workers())
    why = executor.can_ever_fit_gang([_ONE_CPU] * (n + 1))
    assert isinstance(why, str) and why, "a gang bigger than the cluster must say why"
    assert executor.place_gang([_ONE_CPU] * (n + 1)) is None, "all or none"
    assert executor.can_ever_fit_gang([_ONE_CPU]) is None
    workers = executor.place_gang([_ONE_CPU] * min(n, 2))
    assert workers is not None and len(set(workers)) == len(workers) == min(n, 2), workers
    gang = executor.grant_workers("conf-gang", [_ONE_CPU] * len(workers), "PACK", workers)
    assert gang.workers == workers and len(gang.hosts) == len(gang.devices) == len(workers)
    executor.release_gang(gang.gang_id)
    executor.release_gang(gang.gang_id)  # idempotent
    # A gang bigger than the cluster shown as demand, again (it is recomputed), withdrawn
    # twice: accepted by every executor, whether or not its cluster can grow.
    executor.demand("conf-gang", {"CPU": 0.0}, [_ONE_CPU] * (n + 1), "SPREAD")
    executor.demand("conf-gang", {"CPU": 0.0}, [_ONE_CPU] * (n + 1), "SPREAD")
    executor.withdraw("conf-gang")
    executor.withdraw("conf-gang")
    assert executor.place_gang([_ONE_CPU] * len(workers)) is not None, \
        "release_gang must free the gang's slots"
