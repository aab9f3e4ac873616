"""The Dask executor's async side: creating an attempt's actor, and polling it to its end.

Each running attempt is a coroutine on the client's event loop (:meth:`AttemptPolling._drive`)
that creates a :class:`~dasktune.actor.TrialActor` pinned to the worker the ledger chose
(or reuses a pooled one), starts it and long-polls it; what it learns goes to the
executor's queue of events for the driver. A base class of
:class:`~dasktune.execution.dask_executor.DaskExecutor`, using its state.

Why our own RPC: calls go straight to the actor's worker (``actor_execute``, about
1 ms) with timeouts we choose; Dask's ``Actor`` proxy instead waits on the actor's
task when a worker vanishes, which can wait forever for a pinned task.

Back-pressure: the next batch of reports is fetched only once the driver has taken the
last one (see :meth:`AttemptPolling._poll_until_finished`).

Why a report is acknowledged late: a trial whose scheduler decides per result
(``sync_reports``) waits in ``tune.report`` for the acknowledgement. It is sent once the
driver has *handled* the report (its next call of ``DaskExecutor.events``), and a stop
the driver decided meanwhile goes to the actor first, from the same poll loop: the trial
never runs an iteration past a decision to pause, exploit or stop it (as in Ray, whose
trainable waits for the driver's next ``train()``), so its checkpoints, and the decisions
that follow from them, do not depend on timing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from distributed.actor import ProxyRPC
from distributed.protocol import to_serialize
from distributed.scheduler import KilledWorker

from dasktune.actor import TrialActor
from dasktune.execution.dask_gangs import gang_event
from dasktune.execution.dask_runs import (
    Run,
    fence_of,
    format_remote_error,
    settled,
    started_event,
)
from dasktune.execution.protocol import EventKind, ExecEvent, Report

if TYPE_CHECKING:
    from distributed import Future

    from dasktune.execution.dask_executor import DaskExecutor

__all__ = ["AttemptPolling"]

logger = logging.getLogger(__name__)

REPORTS, FINISHED = EventKind.REPORTS, EventKind.FINISHED
LOST, START_FAILED, UNQUEUED = EventKind.LOST, EventKind.START_FAILED, EventKind.UNQUEUED

# The fewest reports one poll fetches, however many trials share the in-flight budget.
_MIN_BATCH = 16


# How often a trial whose last batch the driver has not taken yet is polled for nothing
# but its end (well under executor.orphan-timeout).
_KEEPALIVE = 1.0


class AttemptPolling:
    """The coroutines that run and poll attempts (a base of ``DaskExecutor``)."""

    async def _call(self: DaskExecutor, run: Run, method: str, *args: Any, timeout: float = 30.0) -> Any:
        return await self._call_at(run.worker, run.key, method, *args, timeout=timeout)

    async def _call_at(self: DaskExecutor, worker: str, key: str, method: str, *args: Any,
                       timeout: float = 30.0) -> Any:
        if self._direct:
            rpc = self.client.rpc(worker)
        else:
            rpc = ProxyRPC(self.client.scheduler, worker)
        resp = await asyncio.wait_for(
            rpc.actor_execute(actor=key, function=method,
                              args=[to_serialize(a) for a in args], kwargs={}),
            timeout,
        )
        if resp["status"] == "OK":
            return resp["result"]
        raise resp["exception"]

    async def _close_and_release(self: DaskExecutor, worker: str, key: str, future: Future) -> None:
        """Let an ended actor clean up what it kept for reuse, then let Dask drop it."""
        try:
            await self._call_at(worker, key, "close", timeout=3.0)
        except Exception as exc:  # noqa: BLE001 - it is going away either way
            logger.debug("close of %s on %s failed: %r", key, worker, exc)
        finally:
            future.release()

    async def _call_quiet(self: DaskExecutor, run: Run, method: str, *args: Any) -> None:
        try:
            await self._call(run, method, *args, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - the poll loop reports a dead actor
            logger.debug("%s(%s) on %s failed: %r", method, run.spec.trial_id, run.worker, exc)

    async def _create(self: DaskExecutor, run: Run, params: dict[str, Any]) -> None:
        """Create the attempt's actor on its worker; on failure, report and leave
        ``run.future`` None."""
        spec = run.spec
        tid, attempt = spec.trial_id, spec.attempt
        run.future = self.client.submit(
            TrialActor, spec, params, actor=True, workers=[run.worker],
            allow_other_workers=False, key=run.key, pure=False,
        )
        try:
            await asyncio.wait_for(settled(run.future), self._start_timeout)
            if run.future.status == "finished":
                return
            await run.future  # raises the creation error (an erred future has no value)
        except asyncio.TimeoutError:
            self._put(ExecEvent(LOST, tid, attempt, error=(
                f"actor for trial {tid} was not created on {run.worker} within "
                f"{self._start_timeout:.0f}s")))
        except Exception as exc:  # noqa: BLE001 - creation failed on the worker
            if isinstance(exc, KilledWorker) or run.worker in self._gone or \
                    run.worker not in self.workers(refresh=True):
                self._put(ExecEvent(LOST, tid, attempt, error=repr(exc)))
            else:
                self._put(ExecEvent(START_FAILED, tid, attempt,
                                    error=format_remote_error(exc)))
        future, run.future = run.future, None
        future.release()

    async def _drive(self: DaskExecutor, run: Run, params: dict[str, Any]) -> None:
        spec = run.spec
        tid = spec.trial_id
        try:
            info = None
            if run.future is not None:  # a reused actor: load the new attempt and start it
                try:
                    info = await self._call(run, "start", spec, timeout=30.0)
                except Exception:  # noqa: BLE001 - a dead pooled actor: make a fresh one
                    run.future.release()
                    run.future = None
                    run.key = f"dasktune-{spec.trial_id}-{spec.attempt}"
            if info is None:
                if run.future is None:
                    await self._create(run, params)
                if run.future is None:
                    return
                info = await self._call(run, "start")
            run.started = True
            self._put(started_event(tid, run, info))
            while True:
                await self._poll_until_finished(run)
                nxt = run.next
                if nxt is None or not nxt.started:
                    return
                # The queued attempt runs on this actor now: drive it in this coroutine.
                run, tid = nxt, nxt.spec.trial_id
        except asyncio.CancelledError:
            if run.cancelled or self._closed:
                raise
            # Not ours: something this coroutine awaited was cancelled under it. Without
            # an event the driver would wait for this attempt for ever.
            self._lost(run, f"the driver's call to {run.worker} was cancelled; "
                            "restarting the attempt")
        except Exception as exc:  # noqa: BLE001 - comm errors: the worker (or actor) is gone
            if not self._closed:
                self._ledger.suspect(run.worker)
                self._lost(run, f"lost contact with {run.worker}: {exc!r}")

    def _lost(self: DaskExecutor, run: Run, error: str) -> None:
        """``run`` is lost, and so are the attempts queued behind it on the same actor."""
        self._put(ExecEvent(LOST, run.spec.trial_id, run.spec.attempt, error=error))
        self._unqueued_from(run.next)

    def _unqueued_from(self: DaskExecutor, run: Run | None) -> None:
        """``run`` and every attempt queued behind it will not start: say so."""
        while run is not None:
            self._put(ExecEvent(UNQUEUED, run.spec.trial_id, run.spec.attempt))
            run = run.next

    def _batch_limit(self: DaskExecutor) -> int:
        """The most reports one poll fetches: the running attempts share the driver's
        in-flight budget, so its backlog grows with neither the report count nor the
        number of concurrent trials (a few reports a poll at least, to keep batching)."""
        # Attempts still starting count too: the first polls of a wave of trials must not
        # each take the whole budget.
        return max(_MIN_BATCH, self._in_flight // max(1, self.num_running))

    def _reply_gap(self: DaskExecutor) -> float:
        """The least time between two report-carrying replies of one trial: the running
        attempts share ``executor.report-batches-per-second`` (up to one poll-wait
        apart), so a trial reporting faster than its share sends its reports in batches
        and the round trips' cost per report falls as the rate rises."""
        return min(self._poll_wait, max(1, self.num_running) / self._batches_per_s)

    async def _poll_until_finished(self: DaskExecutor, run: Run) -> None:
        """Collect ``run``'s reports until it ends; on the reply that ends it, hand its
        actor to the attempt queued behind it if the actor started that one."""
        tid, attempt = run.spec.trial_id, run.spec.attempt
        ack = 0  # the newest report the driver has taken: the actor may drop it
        got = 0  # the newest report received
        fence = fence_of(run)
        # Backpressure: the next batch is fetched only once the driver has taken the last
        # one, so a driver that falls behind holds one batch per trial (of at most its
        # share of executor.max-reports-in-flight), never a growing queue; the reports
        # wait in the actor's bounded buffer and then block the trial.
        # Meanwhile empty polls keep the actor from taking the driver for dead.
        taken = run.taken = asyncio.Event()
        taken.set()
        sync = run.spec.sync_reports
        while True:
            if tid in self._pending_stop:
                await self._call_quiet(run, "stop", self._pending_stop.pop(tid), fence)
            if not taken.is_set():
                try:
                    await asyncio.wait_for(taken.wait(), _KEEPALIVE)
                except asyncio.TimeoutError:
                    pass
            fetch = taken.is_set()
            if fetch:
                ack = got
                if run.stop_request is not None:
                    checkpoint, run.stop_request = run.stop_request, None
                    await self._call_quiet(run, "stop", checkpoint, fence)
            reply = await self._call(run, "poll", ack, self._poll_wait if fetch else 0.0,
                                     fence, self._batch_limit() if fetch else 0,
                                     self._reply_gap(),
                                     timeout=self._poll_wait + self._unresponsive)
            if reply.get("gone"):
                self._lost(run, f"the actor on {run.worker} no longer holds attempt {fence}")
                return
            for note in reply.get("gangs") or ():
                self._put(gang_event(tid, attempt, note))
            raw = reply["reports"]
            if raw:
                got = raw[-1][0]
            reports = [Report(*r) for r in raw]
            if reply["finished"] and reply.get("fenced"):
                # Fenced (its task left the worker) and stopped at a report: what it did
                # is not the trial's, and it did not finish the trial.
                self._lost(run, f"attempt {fence} was fenced: {reply['fenced']}")
                return
            if not reply["finished"]:
                if reports:
                    taken.clear()
                    self._put(ExecEvent(REPORTS, tid, attempt, reports=reports), taken=taken,
                              handled=sync)
                continue
            nxt, info = run.next, reply.get("next")
            if nxt is not None and info is not None:
                nxt.future, run.future = run.future, None
                nxt.task, run.task = run.task, None
                nxt.started = True
            # Before the event: the driver may release the attempt at once, and only a
            # finished actor goes back to the pool for the next trial.
            run.finished = True
            started = (nxt.spec.trial_id, info) if nxt is not None and info is not None \
                else None
            self._put(ExecEvent(FINISHED, tid, attempt, reports=reports, error=reply["error"]),
                      successor=started)
            if started:
                return  # the actor reset itself for the next attempt: nothing to drop
            if nxt is not None and nxt.enqueued is not None and nxt.enqueued.done() and \
                    nxt.enqueued.result():
                # Accepted, yet not started (the attempt was fenced): start them anew.
                run.next = None
                self._unqueued_from(nxt)
            await self._call_quiet(run, "poll", got, 0, fence)  # drop the last batch
            return

