"""Queued attempts on the Dask executor: the next trial waits on a running one's actor.

Why: a slot whose trial ends idles until the driver has heard of it and started the
next trial, a few milliseconds, which is most of the cost of a 0.1 s trial.
:meth:`QueuedAttempts.queue_after` sends the next attempt to the running one's actor
ahead of time (only when the searcher's suggestions do not depend on results, see the
controller), or behind the last one queued there: a line, so that a driver that
pauses (a large state save, a garbage-collector pass) leaves no slot idle. The running
attempt's thread runs the next in line the moment the user's code returns, and the
poll that reports the end says it started. A queued attempt is not running: it
counts in no resource ledger until it starts, and :meth:`~QueuedAttempts.unqueue` takes
it back. Calls to an actor name the attempt they mean (``fence_of``), since its thread
may have gone on to the next. A base class of
:class:`~dasktune.execution.dask_executor.DaskExecutor`, using its state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dasktune.execution.dask_runs import Run, fence_of
from dasktune.execution.protocol import EventKind, ExecEvent

if TYPE_CHECKING:
    from dasktune.execution.dask_executor import DaskExecutor
    from dasktune.session import TrialSpec

__all__ = ["QueuedAttempts"]

logger = logging.getLogger(__name__)

UNQUEUED = EventKind.UNQUEUED


class QueuedAttempts:
    """Queueing attempts behind running ones (a base of ``DaskExecutor``)."""

    def queue_after(self: DaskExecutor, running_id: str, spec: TrialSpec) -> bool:
        """Queue ``spec`` on the actor of the running trial ``running_id``, to start there
        with the same resources when that attempt ends (see the module docs); or behind
        the trial queued there last, when ``running_id`` is that one. Its start arrives
        as a STARTED event right after its predecessor's FINISHED event; if it will not
        start there, an UNQUEUED event says so. False if it cannot be queued."""
        prev = self._runs.get(running_id)
        if prev is None:
            prev = self._queued.get(running_id)  # a line: behind one that waits itself
            if prev is None or prev.prev is None:
                return False
        elif not prev.started or prev.finished:
            return False
        # Not for GPU trials: their devices are allocated per start (and they are long).
        if self._closed or \
                prev.resources.get("GPU", 0.0) > 0 or \
                prev.worker in self._retiring or prev.worker in self._gone or \
                spec.trial_id in self._runs or spec.trial_id in self._queued or \
                any(q.prev is prev for q in self._queued.values()):
            return False
        self.withdraw(spec.trial_id)
        run = Run(spec=spec, worker=prev.worker, resources=dict(prev.resources),
                  key=prev.key, prev=prev)
        self._queued[spec.trial_id] = run
        asyncio.run_coroutine_threadsafe(self._enqueue(run), self._loop)
        return True

    def unqueue(self: DaskExecutor, trial_id: str) -> None:
        """Take back a queued attempt: an UNQUEUED event follows, unless it has started
        already (then its STARTED event comes as for any other start)."""
        run = self._queued.get(trial_id)
        if run is not None:
            asyncio.run_coroutine_threadsafe(self._unqueue(run), self._loop)

    def is_queued(self: DaskExecutor, trial_id: str) -> bool:
        return trial_id in self._queued

    async def _enqueue(self: DaskExecutor, run: Run) -> None:
        prev = run.prev
        assert prev is not None
        run.enqueued = self._loop.create_future()
        prev.next = run  # before the answer: the reply that starts it may come first
        try:
            ok = bool(await self._call(prev, "enqueue", run.spec, fence_of(prev), timeout=10.0))
        except Exception as exc:  # noqa: BLE001 - the actor or its worker is gone
            logger.debug("enqueue of %s on %s failed: %r", run.spec.trial_id, run.worker, exc)
            ok = False
        run.enqueued.set_result(ok)
        if not ok:
            if prev.next is run:
                prev.next = None
            self._put(ExecEvent(UNQUEUED, run.spec.trial_id, run.spec.attempt))

    async def _unqueue(self: DaskExecutor, run: Run) -> None:
        prev = run.prev
        assert prev is not None
        while run.enqueued is None:  # _enqueue has not run yet (same loop, FIFO)
            await asyncio.sleep(0)
        if not await run.enqueued or run.started:
            return  # rejected (already told) or started
        try:
            ok = bool(await self._call(prev, "unqueue", run.spec.trial_id, timeout=10.0))
        except Exception:  # noqa: BLE001 - lost with its worker: that path tells it
            return
        if ok:
            # Out of the line: the one behind it now waits behind its predecessor.
            if prev.next is run:
                prev.next = run.next
            if run.next is not None:
                run.next.prev = prev
            run.next = None
            self._put(ExecEvent(UNQUEUED, run.spec.trial_id, run.spec.attempt))
