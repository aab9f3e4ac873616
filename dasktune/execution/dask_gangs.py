"""Gang grants on the Dask executor: several worker slots for one trial, all or none.

The trial asks through its actor's poll replies (notes of :mod:`dasktune.gang_desk`),
which become WORKERS_WANTED / WORKERS_WITHDRAWN / WORKERS_RELEASED events; the driver
decides and calls :meth:`GangGrants.grant_workers` (or ``refuse_workers``). What the
ledger counts changes only on the driver's thread: here, and in the executor's
``events`` as each note passes (:meth:`GangGrants._on_gang_note`).

- While a trial waits for a gang its own (head) resources are lent back to the ledger,
  so that a waiting trial holds nothing the queue needs; GPUs stay allocated (their
  devices are in use by the waiting process). The head counts again once granted,
  refused or withdrawn.
- A gang worker lost: the whole gang's slots come back, the actor is told
  (``session.gang_lost``) and a GANG_LOST event tells the driver; the trial runs on.
  Its own worker lost: the attempt is lost as always, and its end releases its gangs.
- A gang worker retiring: the actor is told (``session.gang_retiring``), as the
  WORKER_RETIRING event passes to the driver; the slots stay the trial's. Each worker of
  a held gang holds a :class:`~dasktune.execution.recovery.GangSlot` actor, so Dask
  does not retire it under the ranks: :meth:`~ClusterEvents.retire_when_free` asks
  again once the trial released the gang.

A base class of :class:`~dasktune.execution.dask_executor.DaskExecutor`, using its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dasktune.execution.dask_runs import Run, fence_of, settled
from dasktune.execution.protocol import EventKind, ExecEvent, GangRequest, WorkerGang
from dasktune.execution.recovery import GangSlot
from dasktune.gang_desk import LOST

if TYPE_CHECKING:
    from distributed import Future

    from dasktune.execution.dask_executor import DaskExecutor

__all__ = ["GANG_NOTES", "GangGrants", "gang_event"]

logger = logging.getLogger(__name__)

#: What a trial's note becomes for the driver.
GANG_NOTES = {"want": EventKind.WORKERS_WANTED, "withdraw": EventKind.WORKERS_WITHDRAWN,
              "release": EventKind.WORKERS_RELEASED}
_ids = itertools.count(1)


def gang_event(trial_id: str, attempt: int, note: tuple[str, Any]) -> ExecEvent:
    """The event of one gang note from a trial's poll reply."""
    what, value = note
    kind = GANG_NOTES[what]
    if isinstance(value, GangRequest):
        return ExecEvent(kind, trial_id, attempt, request=value)
    return ExecEvent(kind, trial_id, attempt, gang_id=str(value))


@dataclass
class _Gang:
    trial_id: str
    gang: WorkerGang


def _lendable(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if k != "GPU" and v}


class GangGrants:
    """Placing, granting and releasing gangs (a base of ``DaskExecutor``)."""

    _gangs: dict[str, _Gang]
    _slots: dict[str, list[Future]]

    def _init_gangs(self: DaskExecutor) -> None:
        self._gangs = {}
        self._slots = {}  # gang id -> its GangSlot actors' futures (client loop only)

    # ------------------------------------------------------------ the driver's calls
    def can_ever_fit_gang(self: DaskExecutor, bundles: list[dict[str, float]],
                          strategy: str = "PACK",
                          head: dict[str, float] | None = None) -> str | None:
        """None if the workers, idle, could hold ``bundles`` (and ``head``), else why."""
        return self._ledger.can_ever_fit_gang(bundles, strategy, head)

    def place_gang(self: DaskExecutor, bundles: list[dict[str, float]], strategy: str = "PACK",
                   head: dict[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        """A distinct worker per bundle that fits it now (after the head's), or None."""
        return self._ledger.place_gang(bundles, strategy, head, head_worker)

    def grant_workers(self: DaskExecutor, trial_id: str, bundles: list[dict[str, float]],
                      strategy: str, workers: list[str], request_id: str = "") -> WorkerGang:
        """Take ``workers`` for ``trial_id``'s gang; deliver it to ``request_id``'s wait."""
        gang_id = f"{trial_id}-gang-{next(_ids)}"
        devices = self._ledger.take_gang(gang_id, workers, bundles)
        info = self.workers()
        gang = WorkerGang(gang_id=gang_id, workers=list(workers),
                          hosts=[str(info.get(w, {}).get("host", "")) for w in workers],
                          devices=devices, bundles=[dict(b) for b in bundles],
                          strategy=strategy)
        self._gangs[gang_id] = _Gang(trial_id, gang)
        self._loop.call_soon_threadsafe(self._hold_slots, gang_id, list(workers))
        if request_id:
            run = self._runs.get(trial_id)
            if run is None:
                self.release_gang(gang_id)
                return gang
            self._stop_waiting(run, request_id)
            asyncio.run_coroutine_threadsafe(self._deliver(run, request_id, gang), self._loop)
        return gang

    def refuse_workers(self: DaskExecutor, trial_id: str, request_id: str, why: str) -> None:
        """The request can never be met: the trial's ``reserve_workers`` raises ValueError."""
        run = self._runs.get(trial_id)
        if run is None:
            return
        self._stop_waiting(run, request_id)
        asyncio.run_coroutine_threadsafe(
            self._call_quiet(run, "refuse_gang", request_id, why, fence_of(run)), self._loop)

    def release_gang(self: DaskExecutor, gang_id: str) -> None:
        """Give the gang's slots back (idempotent)."""
        held = self._gangs.pop(gang_id, None)
        if held is not None:
            self._ledger.give_back_gang(gang_id, held.gang.workers, held.gang.bundles)
            asyncio.run_coroutine_threadsafe(self._drop_slots(gang_id), self._loop)

    # ------------------------------------------------------------ the executor's own
    def gangs_of(self: DaskExecutor, trial_id: str) -> list[WorkerGang]:
        """The gangs ``trial_id`` holds now."""
        return [g.gang for g in self._gangs.values() if g.trial_id == trial_id]

    def gangs_on(self: DaskExecutor, addr: str) -> list[WorkerGang]:
        """The gangs held now with a worker at ``addr``."""
        return [g.gang for g in self._gangs.values() if addr in g.gang.workers]

    def _hold_slots(self: DaskExecutor, gang_id: str, workers: list[str]) -> None:
        # On the client loop, before _drop_slots (both are scheduled in call order).
        if gang_id not in self._slots:
            self._slots[gang_id] = [
                self.client.submit(GangSlot, actor=True, workers=[addr],
                                   allow_other_workers=False, pure=False,
                                   key=f"dasktune-gang-slot-{gang_id}-{i}")
                for i, addr in enumerate(workers)]

    async def _drop_slots(self: DaskExecutor, gang_id: str) -> None:
        futures = self._slots.pop(gang_id, [])
        # Not before each actor exists: the scheduler keeps an actor released while it
        # was being created on its worker's list of actors, so Dask would refuse to
        # retire that worker for good (distributed 2026.8).
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(settled(f) for f in futures)),
                                   self._start_timeout)
        for future in futures:
            future.release()

    def _release_gangs_of(self: DaskExecutor, trial_id: str) -> None:
        for gang in self.gangs_of(trial_id):
            self.release_gang(gang.gang_id)

    def _on_gang_note(self: DaskExecutor, event: ExecEvent) -> None:
        """Account a trial's note as it passes to the driver (driver thread)."""
        if event.kind is EventKind.WORKERS_RELEASED:
            self.release_gang(event.gang_id)
            return
        run = self._runs.get(event.trial_id)
        if run is None or run.spec.attempt != event.attempt or event.request is None:
            return
        rid = event.request.request_id
        if event.kind is EventKind.WORKERS_WANTED:
            if not run.waiting:  # lend the head's slot while it waits
                for k, v in _lendable(run.resources).items():
                    self._ledger.add(run.worker, {k: -v})
            run.waiting.add(rid)
        else:
            self._stop_waiting(run, rid)

    def _stop_waiting(self: DaskExecutor, run: Run, request_id: str) -> None:
        """``run`` waits no more for ``request_id``: its head counts again if that was the last."""
        if request_id not in run.waiting:
            return
        run.waiting.discard(request_id)
        if not run.waiting:
            self._ledger.add(run.worker, _lendable(run.resources))

    def _tell_gangs(self: DaskExecutor, addr: str, news: str) -> None:
        """Tell the trials whose gangs have a worker at ``addr`` the ``news`` of it
        (:data:`~dasktune.gang_desk.LOST`: the gang's slots are free, and a GANG_LOST
        event tells the driver; :data:`~dasktune.gang_desk.RETIRING`: the gang holds on,
        see the module docs)."""
        for gang_id, held in list(self._gangs.items()):
            if addr not in held.gang.workers:
                continue
            run = self._runs.get(held.trial_id)
            if news == LOST:
                self.release_gang(gang_id)
                if run is not None:
                    self._put(ExecEvent(EventKind.GANG_LOST, held.trial_id, run.spec.attempt,
                                        worker=addr, gang_id=gang_id,
                                        error=f"worker {addr} of gang {gang_id} was lost"))
            if run is not None and run.worker != addr:
                asyncio.run_coroutine_threadsafe(
                    self._call_quiet(run, "gang_news", news, gang_id, [addr], fence_of(run)),
                    self._loop)

    async def _deliver(self: DaskExecutor, run: Run, request_id: str, gang: WorkerGang) -> None:
        """Hand ``gang`` to the trial; if nobody takes it, its slots go back."""
        try:
            taken = bool(await self._call(run, "grant", request_id, gang, fence_of(run),
                                          timeout=10.0))
        except Exception as exc:  # noqa: BLE001 - the attempt's poll reports a dead actor
            logger.debug("grant of %s to %s failed: %r", gang.gang_id, run.spec.trial_id, exc)
            taken = False
        if not taken:  # back on the driver's thread, through the event queue
            self._put(ExecEvent(EventKind.WORKERS_RELEASED, run.spec.trial_id,
                                run.spec.attempt, gang_id=gang.gang_id))
