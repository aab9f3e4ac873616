"""The Dask executor: runs trial attempts as actors on a Dask cluster's workers.

It implements :class:`~dasktune.execution.protocol.Executor`; the driver loop (main
thread) calls :meth:`DaskExecutor.start`, :meth:`~DaskExecutor.stop` and
:meth:`~DaskExecutor.events`. Placement and accounting are the
:class:`~dasktune.execution.ledger.ResourceLedger`'s; what the executor learns goes
into one thread-safe queue as :class:`~dasktune.execution.protocol.ExecEvent` values.
A local storage folder's visibility from each worker (:mod:`dasktune.shared_path`) is
checked here, before a worker's first trial.

The executor's rooms, each a base class of :class:`DaskExecutor` (one object, one
state, as the driver's ``TrialEvents``):

- :mod:`.dask_polling` -- the async side: create an attempt's actor, poll it to its end;
- :mod:`.dask_queue` -- attempts queued on a running one's actor;
- :mod:`.dask_cluster` -- lost, retiring and added workers; scale-up demand (tasks, gangs);
- :mod:`.dask_gangs` -- gang grants: several workers for one trial, all or none.

:mod:`.dask_runs` holds the per-attempt record (:class:`~.dask_runs.Run`) they share.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
from typing import TYPE_CHECKING, Any

from dasktune import _dask_config
from dasktune.execution import recovery
from dasktune.execution.dask_cluster import ClusterEvents
from dasktune.execution.dask_gangs import GANG_NOTES, GangGrants
from dasktune.execution.dask_polling import AttemptPolling
from dasktune.execution.dask_queue import QueuedAttempts
from dasktune.execution.dask_runs import EventItem, Run, cancel_run, fence_of, started_event
from dasktune.execution.ledger import ResourceLedger
from dasktune.execution.protocol import EventKind, ExecEvent
from dasktune.gang_desk import RETIRING

if TYPE_CHECKING:
    from distributed import Client, Future

    from dasktune.session import TrialSpec
    from dasktune.shared_path import SharedPathCheck

__all__ = ["DaskExecutor"]

logger = logging.getLogger(__name__)

UNQUEUED = EventKind.UNQUEUED
_GANG_NOTE_KINDS = frozenset(GANG_NOTES.values())


class DaskExecutor(AttemptPolling, QueuedAttempts, ClusterEvents, GangGrants):
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
        self._events: queue.SimpleQueue[EventItem] = queue.SimpleQueue()
        self._held: list[EventItem] = []  # read from _events, for the next events() call
        self._runs: dict[str, Run] = {}
        self._ledger = ResourceLedger(self._fetch_workers)
        self._path_check = path_check
        self._poll_wait = _dask_config.get_seconds("executor.poll-wait")
        self._batches_per_s = float(_dask_config.get("executor.report-batches-per-second"))
        if self._batches_per_s <= 0:
            raise ValueError("dasktune.executor.report-batches-per-second must be > 0, got "
                             f"{self._batches_per_s:g}")
        self._unresponsive = _dask_config.get_seconds("executor.unresponsive-timeout")
        self._in_flight = int(_dask_config.get("executor.max-reports-in-flight"))
        self._start_timeout = _dask_config.get_seconds("executor.actor-start-timeout")
        self._direct = bool(_dask_config.get("executor.direct-to-workers"))
        self._closed = False
        self._pending_stop: dict[str, bool] = {}
        # Sync-reports batches returned by the last events() call (see EventItem.handled).
        self._handled: list[asyncio.Event] = []
        self._retiring = self._ledger.retiring
        self._gone = self._ledger.gone
        self._self_closing: set[str] = set()  # in Worker.close already: never re-retired
        self._watching = False
        self._idle: dict[str, list[tuple[str, Future]]] = {}
        self._pool_size = int(_dask_config.get("executor.idle-actors-per-worker"))
        self._queued: dict[str, Run] = {}  # trial id -> attempt queued on a busy actor
        # Trials that wait for resources -> their request (driver thread); their
        # placeholder futures live on the client loop only, so the two never race.
        self._demands: dict[str, dict[str, float]] = {}
        self._demand_futures: dict[str, Future] = {}
        self._demand_seq = 0
        # Trials whose gangs wait -> what the scheduler was told (lacking, keep, known),
        # and the messages in flight (see .gang_demand).
        self._gang_demands: dict[str, tuple[int, list[str], list[str]]] = {}
        self._gang_sends: list[concurrent.futures.Future[None]] = []
        self._init_gangs()

    def _put(self, event: ExecEvent, taken: asyncio.Event | None = None,
             successor: tuple[str, dict[str, Any]] | None = None,
             handled: bool = False) -> None:
        self._events.put(EventItem(event, taken, handled=handled, successor=successor))

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
        run = Run(spec=spec, worker=worker, resources=dict(resources),
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

    def _stop_on_loop(self, run: Run, checkpoint: bool) -> None:
        if run.taken is not None and not run.taken.is_set():
            # Its poll loop waits for the driver to handle a batch: it sends the stop
            # before the poll that acknowledges the batch (see dask_polling's docs).
            prev = run.stop_request
            run.stop_request = checkpoint if prev is None else prev and checkpoint
            return
        asyncio.ensure_future(self._call_quiet(run, "stop", checkpoint, fence_of(run)))

    def checkpoint(self, trial_id: str) -> None:
        """Ask a running attempt for a checkpoint after its step in flight (class
        trainables; asked by a Callback through ``SHOULD_CHECKPOINT``)."""
        run = self._runs.get(trial_id)
        if run is None or not run.started:
            return
        asyncio.run_coroutine_threadsafe(
            self._call_quiet(run, "checkpoint", fence_of(run)), self._loop)

    def release(self, trial_id: str) -> None:
        """Forget an attempt (after its FINISHED/LOST/START_FAILED event): free its
        resources and let Dask drop the actor."""
        run = self._runs.pop(trial_id, None)
        if run is None:
            return
        for request_id in list(run.waiting):  # its head was lent while it waited
            self._stop_waiting(run, request_id)
        self._release_gangs_of(trial_id)
        self._ledger.give_back(run.worker, trial_id, run.resources)
        cancel_run(run)
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

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event so far, waiting up to ``timeout`` s for the first."""
        # The driver has handled what the last call returned: its stops are on their way.
        self._release_handled()
        got, self._held = self._held, []
        if not got:
            try:
                got.append(self._events.get(timeout=timeout))
            except queue.Empty:
                return []
        while True:
            try:
                got.append(self._events.get_nowait())
            except queue.Empty:
                break
        # A gang note starts its batch. Reading one changes the ledger (the asking trial
        # lends its slot); were the note behind other events, the driver, refilling slots
        # as it handles those, could start a trial in the lent slot before it learned
        # from the note that trials now start with their gangs.
        cut = next((i for i, item in enumerate(got)
                    if i and item.event.kind in _GANG_NOTE_KINDS), None)
        if cut is not None:
            got, self._held = got[:cut], got[cut:]
        taken = [item.taken for item in got if item.taken is not None and not item.handled]
        if taken:  # one wake-up of the client loop for the whole batch
            self._loop.call_soon_threadsafe(_set_all, taken)
        self._handled = [item.taken for item in got if item.taken is not None and item.handled]
        out: list[ExecEvent] = []
        for item in got:
            event = item.event
            if event.kind in _GANG_NOTE_KINDS:
                self._on_gang_note(event)
            elif event.kind is EventKind.WORKER_RETIRING:
                self._tell_gangs(event.worker, RETIRING)  # here: gangs change on this thread
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
                out.append(started_event(tid, run, info))
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
                        self._call_quiet(run, "stop", False, fence_of(run)), self._loop).result(2)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            self.release(tid)
        closing = [asyncio.run_coroutine_threadsafe(self._close_and_release(addr, key, future),
                                                    self._loop)
                   for addr, pool in self._idle.items() for key, future in pool]
        self._idle.clear()
        for tid in {*self._demands, *self._gang_demands}:
            self.withdraw(tid)
        closing.extend(self._gang_sends)
        # Runs after the releases queued above: when it is done, they have been made.
        closing.append(asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop))
        for done in closing:
            try:
                done.result(5)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()

