"""The Dask executor: runs trial attempts as actors on a Dask cluster's workers.

It implements :class:`~dasktune.execution.protocol.Executor`; the driver loop (main
thread) calls :meth:`DaskExecutor.start`, :meth:`~DaskExecutor.stop` and
:meth:`~DaskExecutor.events`. Each running attempt is a coroutine on the client's event
loop that creates a :class:`~dasktune.actor.TrialActor` pinned to the worker the
:class:`~dasktune.execution.ledger.ResourceLedger` chose, starts it and long-polls it;
what it learns goes into one thread-safe queue as
:class:`~dasktune.execution.protocol.ExecEvent` values. Cluster events (a worker lost,
retiring or added) come from the plugins of :mod:`dasktune.execution.recovery`; a local
storage folder's visibility from each worker (:mod:`dasktune.shared_path`) is checked
here, before a worker's first trial.

This module is over ~400 lines because the queued-attempt lines and the backpressure of
the poll loop share the per-attempt state (``_Run``) and the client loop with the start
and stop paths: split apart, each half would reach into the other's records.

Why our own RPC: calls go straight to the actor's worker (``actor_execute``, about
1 ms) with timeouts we choose; Dask's ``Actor`` proxy instead waits on the actor's
task when a worker vanishes, which can wait forever for a pinned task.

Why queued attempts: a slot whose trial ends idles until the driver has heard of it and
started the next trial, a few milliseconds, which is most of the cost of a 0.1 s trial.
:meth:`DaskExecutor.queue_after` sends the next attempt to the running one's actor ahead
of time (only when the searcher's suggestions do not depend on results, see the
controller), or behind the last one queued there: a line, so that a driver that
pauses (a large state save, a garbage-collector pass) leaves no slot idle. The running
attempt's thread runs the next in line the moment the user's code returns, and the
poll that reports the end says it started. A queued attempt is not running: it
counts in no resource ledger until it starts, and :meth:`~DaskExecutor.unqueue` takes
it back. Calls to an actor name the attempt they mean (``_fence``), since its thread may
have gone on to the next.

Why a report is acknowledged late: a trial whose scheduler decides per result
(``sync_reports``) waits in ``tune.report`` for the acknowledgement. It is sent once the
driver has *handled* the report (its next call of :meth:`DaskExecutor.events`), and a stop
the driver decided meanwhile goes to the actor first, from the same poll loop: the trial
never runs an iteration past a decision to pause, exploit or stop it (as in Ray, whose
trainable waits for the driver's next ``train()``), so its checkpoints, and the decisions
that follow from them, do not depend on timing.

Why demand tasks: Dask's ``Adaptive`` sizes a cluster from the scheduler's view
(:meth:`distributed.Scheduler.adaptive_target` counts queued and unrunnable tasks), and
a trial becomes a task only once it is placed, so an elastic cluster would never grow
for trials that wait. :meth:`DaskExecutor.demand` keeps one trivial task per waiting
trial, with the trial's ``resources=``, under the key ``dasktune-demand-<trial_id>-<n>``
(task prefix ``dasktune-demand``); :meth:`~DaskExecutor.withdraw` releases it. Dask
accounts resources only for queued and running tasks: a placeholder that some worker
can run finishes there at once and counts no more, so it shows demand that no worker
the scheduler knows can meet (no workers yet, or none with the trial's tags). And
``Adaptive`` weighs placeholders against every worker's threads, not knowing that trials
occupy them: it adds workers for trials that no worker could take, not one per trial.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distributed.actor import ProxyRPC
from distributed.protocol import to_serialize
from distributed.scheduler import KilledWorker

from dasktune import _dask_config
from dasktune.actor import TrialActor, attempt_key
from dasktune.execution import recovery
from dasktune.execution.ledger import ResourceLedger
from dasktune.execution.protocol import EventKind, ExecEvent, Report

if TYPE_CHECKING:
    from distributed import Client, Future

    from dasktune.session import TrialSpec
    from dasktune.shared_path import SharedPathCheck

logger = logging.getLogger(__name__)

STARTED, REPORTS, FINISHED = EventKind.STARTED, EventKind.REPORTS, EventKind.FINISHED
LOST, START_FAILED, UNQUEUED = EventKind.LOST, EventKind.START_FAILED, EventKind.UNQUEUED
WORKER_LOST, WORKER_RETIRING = EventKind.WORKER_LOST, EventKind.WORKER_RETIRING
WORKER_ADDED = EventKind.WORKER_ADDED


@dataclass
class _Item:
    """An event on its way to the driver, with what the executor needs back from it."""

    event: ExecEvent
    # Set (on the client loop) once the driver has taken the event: see _poll_until_finished.
    taken: asyncio.Event | None = None
    # A sync-reports attempt's reports: ``taken`` is set only once the driver has handled
    # them (at its next events() call), after the stops it decided on them.
    handled: bool = False
    # FINISHED: the queued attempt that took over the actor in the same reply, and where.
    successor: tuple[str, dict[str, Any]] | None = None


@dataclass
class _Run:
    spec: TrialSpec
    worker: str
    resources: dict[str, float]
    key: str
    future: Future | None = None
    task: asyncio.Future[Any] | None = None
    started: bool = False
    finished: bool = False  # its actor's thread ended cleanly: the actor can be reused
    next: _Run | None = None  # queued behind this attempt on its actor (loop thread only)
    prev: _Run | None = None  # the attempt this one is queued behind
    enqueued: asyncio.Future[bool] | None = None  # the actor's answer to enqueue
    cancelled: bool = False  # the executor cancelled its task (released, or worker lost)
    # Loop thread only: the poll loop's "driver has taken the last batch" event, and a
    # stop decided on a batch not yet handled (checkpoint first or not), sent before the
    # poll that acknowledges it.
    taken: asyncio.Event | None = None
    stop_request: bool | None = None


class DaskExecutor:
    """Runs trial attempts as Dask actors on the workers of ``client``'s cluster.

    Args:
        client: the cluster's client.
        path_check: for a local storage folder, the check that a worker sees it; a
            worker that does not is never placed on (with a warning).
    """

    can_queue = True

    def __init__(self, client: Client, path_check: SharedPathCheck | None = None):
        self.client = client
        self._loop: asyncio.AbstractEventLoop = client.loop.asyncio_loop  # type: ignore[attr-defined]
        self._events: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._runs: dict[str, _Run] = {}
        self._ledger = ResourceLedger(self._fetch_workers)
        self._path_check = path_check
        self._poll_wait = _dask_config.get_seconds("executor.poll-wait")
        self._unresponsive = _dask_config.get_seconds("executor.unresponsive-timeout")
        self._in_flight = int(_dask_config.get("executor.max-reports-in-flight"))
        self._start_timeout = _dask_config.get_seconds("executor.actor-start-timeout")
        self._direct = bool(_dask_config.get("executor.direct-to-workers"))
        self._closed = False
        self._pending_stop: dict[str, bool] = {}
        # Sync-reports batches returned by the last events() call (see _Item.handled).
        self._handled: list[asyncio.Event] = []
        self._retiring = self._ledger.retiring
        self._gone = self._ledger.gone
        self._self_closing: set[str] = set()  # in Worker.close already: never re-retired
        self._watching = False
        self._idle: dict[str, list[tuple[str, Future]]] = {}
        self._pool_size = int(_dask_config.get("executor.idle-actors-per-worker"))
        self._queued: dict[str, _Run] = {}  # trial id -> attempt queued on a busy actor
        # Trials that wait for resources -> their request (driver thread); their
        # placeholder futures live on the client loop only, so the two never race.
        self._demands: dict[str, dict[str, float]] = {}
        self._demand_futures: dict[str, Future] = {}
        self._demand_seq = 0

    def _put(self, event: ExecEvent, taken: asyncio.Event | None = None,
             successor: tuple[str, dict[str, Any]] | None = None,
             handled: bool = False) -> None:
        self._events.put(_Item(event, taken, handled=handled, successor=successor))

    # ------------------------------------------------------------ cluster events
    def watch_cluster(self) -> bool:
        """Install the recovery plugin and listen to it (worker loss in milliseconds)."""
        if not recovery.register(self.client):
            return False

        def on_event(event: Any) -> None:
            _t, msg = event
            worker = msg.get("worker", "")
            if msg.get("op") == "remove-worker":
                self._gone.add(worker)
                self._ledger.mark_stale()
                self._put(ExecEvent(WORKER_LOST, worker=worker))
            elif msg.get("op") == "retiring":
                if msg.get("status") == "closing":
                    self._self_closing.add(worker)
                if worker not in self._retiring:
                    self._retiring.add(worker)
                    self._put(ExecEvent(WORKER_RETIRING, worker=worker))
            elif msg.get("op") == "add-worker":
                self._gone.discard(worker)
                self._ledger.mark_stale()
                self._put(ExecEvent(WORKER_ADDED, worker=worker))

        self.client.subscribe_topic(recovery.TOPIC, on_event)
        self._watching = True
        return True

    def retire_when_free(self, addr: str) -> bool:
        """Ask Dask again to retire ``addr`` once no trial of ours is on it (dropping
        the idle actors pooled there, which would make Dask refuse)."""
        if addr in self._retiring:
            self._drop_idle(addr)
        if self.running_on(addr) or addr not in self._retiring:
            return False

        async def _retire() -> None:
            # The release of our actors reaches the scheduler a moment after this call
            # may: Dask refuses to retire a worker that still holds an actor, so retry.
            for _ in range(50):
                if addr in self._self_closing:
                    return  # it closes itself once our trials left (EvacuatePlugin)
                try:
                    done = await self.client.scheduler.retire_workers(
                        workers=[addr], close_workers=True, remove=True)
                except Exception as exc:  # noqa: BLE001 - the worker may be gone already
                    logger.debug("retire %s: %r", addr, exc)
                    return
                if addr in (done or {}) or addr in self._gone:
                    return
                await asyncio.sleep(0.2)

        asyncio.run_coroutine_threadsafe(_retire(), self._loop)
        return True

    # ------------------------------------------------------------ workers
    def _fetch_workers(self) -> dict[str, dict[str, Any]]:
        try:
            info = self.client.scheduler_info(n_workers=-1)
        except TypeError:  # older distributed without n_workers
            info = self.client.scheduler_info()
        return dict(info.get("workers", {}))

    def workers(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """Live workers and their info (refreshed at most every 0.5 s)."""
        return self._ledger.workers(refresh)

    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        """None if some worker could hold ``resources`` when idle, else why not."""
        return self._ledger.can_ever_fit(resources)

    def place(self, resources: dict[str, float]) -> str | None:
        """The worker with the most free CPU that fits ``resources`` now, or None; a
        worker that cannot see a local storage folder is left out for good."""
        worker = self._ledger.place(resources)
        while worker is not None and self._path_check is not None and \
                self._path_check.blind([worker]):
            logger.warning("worker %s cannot see the storage folder %s (another host or "
                           "mount): no trials will run on it", worker,
                           self._path_check.storage.uri)
            self._ledger.excluded.add(worker)
            worker = self._ledger.place(resources)
        return worker

    @property
    def num_running(self) -> int:
        return len(self._runs)

    def running_on(self, addr: str) -> list[str]:
        return [tid for tid, run in self._runs.items() if run.worker == addr]

    # ------------------------------------------------------------ scale-up demand
    def demand(self, trial_id: str, resources: dict[str, float]) -> None:
        """Show the scheduler that ``trial_id`` waits for ``resources`` (see the module
        docs): one placeholder task per trial, however often this is called. Returns at
        once; the task is submitted on the client loop."""
        if self._closed or trial_id in self._demands or trial_id in self._runs:
            return
        request = {k: float(v) for k, v in resources.items() if v > 0}
        self._demands[trial_id] = request
        self._demand_seq += 1
        # A fresh key each time: a released key may linger on the scheduler a moment.
        key = f"dasktune-demand-{trial_id}-{self._demand_seq}"
        self._loop.call_soon_threadsafe(self._submit_demand, trial_id, key, request)

    def withdraw(self, trial_id: str) -> None:
        """Release ``trial_id``'s placeholder task, if it has one (idempotent)."""
        if self._demands.pop(trial_id, None) is not None:
            self._loop.call_soon_threadsafe(self._release_demand, trial_id)

    def _submit_demand(self, trial_id: str, key: str, request: dict[str, float]) -> None:
        # On the client loop, in call order with _release_demand.
        if trial_id in self._demand_futures:
            return
        try:
            self._demand_futures[trial_id] = self.client.submit(
                _waiting_trial, trial_id, key=key, resources=request or None, pure=False)
        except Exception as exc:  # noqa: BLE001 - demand is advisory; placement goes on
            logger.debug("demand for %s not submitted: %r", trial_id, exc)

    def _release_demand(self, trial_id: str) -> None:
        future = self._demand_futures.pop(trial_id, None)
        if future is not None:
            future.release()

    # ------------------------------------------------------------ control
    def start(self, spec: TrialSpec, resources: dict[str, float], worker: str,
              params: dict[str, Any] | None = None) -> None:
        """Start an attempt of ``spec`` on ``worker`` (chosen by :meth:`place`)."""
        if spec.trial_id in self._runs:
            raise RuntimeError(f"trial {spec.trial_id} is already running")
        self.withdraw(spec.trial_id)  # placed: it waits no more
        gpu_ids = self._ledger.take(worker, spec.trial_id, resources)
        if gpu_ids:
            spec.gpu_ids = gpu_ids
        run = _Run(spec=spec, worker=worker, resources=dict(resources),
                   key=f"dasktune-{spec.trial_id}-{spec.attempt}")
        idle = self._idle.get(worker)
        if idle and not spec.gpu_ids:
            # Reuse an actor whose trial ended on this worker: no task round trip
            # through the scheduler for the next trial (Ray's reuse_actors, always on).
            run.key, run.future = idle.pop()
        self._runs[spec.trial_id] = run
        run.task = asyncio.run_coroutine_threadsafe(self._drive(run, params or {}), self._loop)

    def stop(self, trial_id: str, checkpoint: bool = False) -> None:
        """Ask an attempt to end (after its next checkpoint if ``checkpoint``)."""
        run = self._runs.get(trial_id) or self._queued.get(trial_id)
        if run is None:
            return
        if not run.started:
            self._pending_stop[trial_id] = checkpoint  # applied once the actor starts
            return
        # Through the loop, in order with events()'s "handled" callback (both queued from
        # this thread): a stop decided on a batch reaches the actor before its ack does.
        self._loop.call_soon_threadsafe(self._stop_on_loop, run, checkpoint)

    def _stop_on_loop(self, run: _Run, checkpoint: bool) -> None:
        if run.taken is not None and not run.taken.is_set():
            # Its poll loop waits for the driver to handle a batch: it sends the stop
            # before the poll that acknowledges the batch (see the module docs).
            prev = run.stop_request
            run.stop_request = checkpoint if prev is None else prev and checkpoint
            return
        asyncio.ensure_future(self._call_quiet(run, "stop", checkpoint, _fence(run)))

    def checkpoint(self, trial_id: str) -> None:
        """Ask a running attempt for a checkpoint after its step in flight (class
        trainables; asked by a Callback through ``SHOULD_CHECKPOINT``)."""
        run = self._runs.get(trial_id)
        if run is None or not run.started:
            return
        asyncio.run_coroutine_threadsafe(
            self._call_quiet(run, "checkpoint", _fence(run)), self._loop)

    def queue_after(self, running_id: str, spec: TrialSpec) -> bool:
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
        run = _Run(spec=spec, worker=prev.worker, resources=dict(prev.resources),
                   key=prev.key, prev=prev)
        self._queued[spec.trial_id] = run
        asyncio.run_coroutine_threadsafe(self._enqueue(run), self._loop)
        return True

    def unqueue(self, trial_id: str) -> None:
        """Take back a queued attempt: an UNQUEUED event follows, unless it has started
        already (then its STARTED event comes as for any other start)."""
        run = self._queued.get(trial_id)
        if run is not None:
            asyncio.run_coroutine_threadsafe(self._unqueue(run), self._loop)

    def is_queued(self, trial_id: str) -> bool:
        return trial_id in self._queued

    def release(self, trial_id: str) -> None:
        """Forget an attempt (after its FINISHED/LOST/START_FAILED event): free its
        resources and let Dask drop the actor."""
        run = self._runs.pop(trial_id, None)
        if run is None:
            return
        self._ledger.give_back(run.worker, trial_id, run.resources)
        _cancel(run)
        future = run.future
        run.future = None
        if future is None:
            return
        pool = self._idle.setdefault(run.worker, [])
        # Never pool on a retiring worker: Dask refuses to retire one that holds an actor.
        if run.finished and not self._closed and run.worker not in self._gone and \
                run.worker not in self._retiring and len(pool) < self._pool_size:
            pool.append((run.key, future))
        elif run.finished and run.worker not in self._gone:
            asyncio.run_coroutine_threadsafe(
                self._close_and_release(run.worker, run.key, future), self._loop)
        else:
            self._loop.call_soon_threadsafe(future.release)

    def lose_worker(self, addr: str) -> list[str]:
        """Mark every attempt on ``addr`` lost (told by the scheduler plugin)."""
        lost = self.running_on(addr)
        self._drop_idle(addr)
        for tid, run in self._queued.items():
            if run.worker == addr:
                self._put(ExecEvent(UNQUEUED, tid, run.spec.attempt))
        for tid in lost:
            run = self._runs[tid]
            self._put(ExecEvent(LOST, tid, run.spec.attempt, error=f"worker {addr} was lost"))
            _cancel(run)
        self._ledger.mark_stale()
        return lost

    def _drop_idle(self, addr: str) -> None:
        """Let Dask drop the idle actors pooled on ``addr``."""
        for _key, future in self._idle.pop(addr, []):
            self._loop.call_soon_threadsafe(future.release)

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event so far, waiting up to ``timeout`` s for the first."""
        # The driver has handled what the last call returned: its stops are on their way.
        self._release_handled()
        got: list[_Item] = []
        try:
            got.append(self._events.get(timeout=timeout))
        except queue.Empty:
            return got
        while True:
            try:
                got.append(self._events.get_nowait())
            except queue.Empty:
                break
        taken = [item.taken for item in got if item.taken is not None and not item.handled]
        if taken:  # one wake-up of the client loop for the whole batch
            self._loop.call_soon_threadsafe(_set_all, taken)
        self._handled = [item.taken for item in got if item.taken is not None and item.handled]
        out: list[ExecEvent] = []
        for item in got:
            event = item.event
            if event.kind is UNQUEUED:
                run = self._queued.get(event.trial_id)
                if run is None or run.spec.attempt != event.attempt:
                    continue  # told twice (say, lost and rejected): once is enough
                del self._queued[event.trial_id]
            out.append(event)
            started = item.successor
            if started is not None:
                # The queued attempt took over the actor in the same reply: account for
                # it here, in one step with the end of the last, so no other trial is
                # placed into the slot in between.
                tid, info = started
                run = self._queued.pop(tid, None)
                if run is None:
                    # Taken back first (its UNQUEUED event came, or the executor is shutting
                    # down): no one will poll it, and once its actor's future is dropped
                    # the fence plugin stops it at its next report.
                    logger.debug("trial %s started on its queue after it was taken back", tid)
                    continue
                self._runs[tid] = run
                self._ledger.add(run.worker, run.resources)
                out.append(_started(tid, run, info))
        return out

    def _release_handled(self) -> None:
        handled, self._handled = self._handled, []
        if handled:
            self._loop.call_soon_threadsafe(_set_all, handled)

    def shutdown(self) -> None:
        """Stop every attempt and drop its actor."""
        self._closed = True
        self._release_handled()
        for run in list(self._queued.values()):  # so that no stop below starts one
            if run.prev is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._call_quiet(
                        run.prev, "unqueue", run.spec.trial_id), self._loop).result(2)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
        self._queued.clear()
        if self._watching:
            try:
                self.client.unsubscribe_topic(recovery.TOPIC)
            except Exception:  # noqa: BLE001
                pass
        for tid in list(self._runs):
            run = self._runs[tid]
            if run.started:
                try:
                    asyncio.run_coroutine_threadsafe(
                        self._call_quiet(run, "stop", False, _fence(run)), self._loop).result(2)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            self.release(tid)
        closing = [asyncio.run_coroutine_threadsafe(self._close_and_release(addr, key, future),
                                                    self._loop)
                   for addr, pool in self._idle.items() for key, future in pool]
        self._idle.clear()
        for tid in list(self._demands):
            self.withdraw(tid)
        # Runs after the releases queued above: when it is done, they have been made.
        closing.append(asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop))
        for done in closing:
            try:
                done.result(5)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    # ------------------------------------------------------------ async side
    async def _call(self, run: _Run, method: str, *args: Any, timeout: float = 30.0) -> Any:
        return await self._call_at(run.worker, run.key, method, *args, timeout=timeout)

    async def _call_at(self, worker: str, key: str, method: str, *args: Any,
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

    async def _close_and_release(self, worker: str, key: str, future: Future) -> None:
        """Let an ended actor clean up what it kept for reuse, then let Dask drop it."""
        try:
            await self._call_at(worker, key, "close", timeout=3.0)
        except Exception as exc:  # noqa: BLE001 - it is going away either way
            logger.debug("close of %s on %s failed: %r", key, worker, exc)
        finally:
            future.release()

    async def _call_quiet(self, run: _Run, method: str, *args: Any) -> None:
        try:
            await self._call(run, method, *args, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - the poll loop reports a dead actor
            logger.debug("%s(%s) on %s failed: %r", method, run.spec.trial_id, run.worker, exc)

    async def _enqueue(self, run: _Run) -> None:
        prev = run.prev
        assert prev is not None
        run.enqueued = self._loop.create_future()
        prev.next = run  # before the answer: the reply that starts it may come first
        try:
            ok = bool(await self._call(prev, "enqueue", run.spec, _fence(prev), timeout=10.0))
        except Exception as exc:  # noqa: BLE001 - the actor or its worker is gone
            logger.debug("enqueue of %s on %s failed: %r", run.spec.trial_id, run.worker, exc)
            ok = False
        run.enqueued.set_result(ok)
        if not ok:
            if prev.next is run:
                prev.next = None
            self._put(ExecEvent(UNQUEUED, run.spec.trial_id, run.spec.attempt))

    async def _unqueue(self, run: _Run) -> None:
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

    async def _create(self, run: _Run, params: dict[str, Any]) -> None:
        """Create the attempt's actor on its worker; on failure, report and leave
        ``run.future`` None."""
        spec = run.spec
        tid, attempt = spec.trial_id, spec.attempt
        run.future = self.client.submit(
            TrialActor, spec, params, actor=True, workers=[run.worker],
            allow_other_workers=False, key=run.key, pure=False,
        )
        try:
            await asyncio.wait_for(_settled(run.future), self._start_timeout)
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
                                    error=_format_remote_error(exc)))
        future, run.future = run.future, None
        future.release()

    async def _drive(self, run: _Run, params: dict[str, Any]) -> None:
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
            self._put(_started(tid, run, info))
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

    def _lost(self, run: _Run, error: str) -> None:
        """``run`` is lost, and so are the attempts queued behind it on the same actor."""
        self._put(ExecEvent(LOST, run.spec.trial_id, run.spec.attempt, error=error))
        self._unqueued_from(run.next)

    def _unqueued_from(self, run: _Run | None) -> None:
        """``run`` and every attempt queued behind it will not start: say so."""
        while run is not None:
            self._put(ExecEvent(UNQUEUED, run.spec.trial_id, run.spec.attempt))
            run = run.next

    def _batch_limit(self) -> int:
        """The most reports one poll fetches: the running attempts share the driver's
        in-flight budget, so its backlog grows with neither the report count nor the
        number of concurrent trials (a few reports a poll at least, to keep batching)."""
        # Attempts still starting count too: the first polls of a wave of trials must not
        # each take the whole budget.
        return max(_MIN_BATCH, self._in_flight // max(1, self.num_running))

    async def _poll_until_finished(self, run: _Run) -> None:
        """Collect ``run``'s reports until it ends; on the reply that ends it, hand its
        actor to the attempt queued behind it if the actor started that one."""
        tid, attempt = run.spec.trial_id, run.spec.attempt
        ack = 0  # the newest report the driver has taken: the actor may drop it
        got = 0  # the newest report received
        fence = _fence(run)
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
                                     timeout=self._poll_wait + self._unresponsive)
            if reply.get("gone"):
                self._lost(run, f"the actor on {run.worker} no longer holds attempt {fence}")
                return
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


# The fewest reports one poll fetches, however many trials share the in-flight budget.
_MIN_BATCH = 16

# How often a trial whose last batch the driver has not taken yet is polled for nothing
# but its end (well under executor.orphan-timeout).
_KEEPALIVE = 1.0


async def _settled(future: Future) -> None:
    """Wait until ``future`` is done, without fetching its value.

    ``await future`` would gather the actor's handle, which we never use, through the
    client's gather that concurrent awaiters share: cancelling any one of them (a trial
    released while its actor was being created) cancels that shared gather under all the
    others. Dask's own ``wait`` waits on the same state.
    """
    await future._state.wait()


def _started(trial_id: str, run: _Run, where: dict[str, Any]) -> ExecEvent:
    """The STARTED event of ``run``, from what its actor said of where it runs."""
    return ExecEvent(STARTED, trial_id, run.spec.attempt, worker=where.get("worker", run.worker),
                     host=where.get("host", ""))


def _fence(run: _Run) -> str:
    """How the actor's methods name ``run`` (its thread may have gone on to the next)."""
    return attempt_key(run.spec)


def _cancel(run: _Run) -> None:
    """Cancel ``run``'s coroutine, marked as the executor's doing (see ``_drive``)."""
    if run.task is not None and not run.task.done():
        run.cancelled = True
        run.task.cancel()


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


def _waiting_trial(trial_id: str) -> str:
    """The placeholder task of :meth:`DaskExecutor.demand`: does nothing."""
    return trial_id


def _format_remote_error(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

