"""The Dask executor's view of the cluster: lost, retiring and added workers, and demand.

Cluster events come from the plugins of :mod:`dasktune.execution.recovery` over a
pub/sub topic (:meth:`ClusterEvents.watch_cluster`) and become WORKER_* events for the
driver; a retiring worker is retired once no trial of ours and no gang is on it.

Why demand tasks: Dask's ``Adaptive`` sizes a cluster from the scheduler's view
(:meth:`distributed.Scheduler.adaptive_target` counts queued and unrunnable tasks), and
a trial becomes a task only once it is placed, so an elastic cluster would never grow
for trials that wait. :meth:`ClusterEvents.demand` keeps one trivial task per waiting
trial, with the trial's ``resources=``, under the key ``dasktune-demand-<trial_id>-<n>``
(task prefix ``dasktune-demand``); :meth:`~ClusterEvents.withdraw` releases it. Dask
accounts resources only for queued and running tasks: a placeholder that some worker
can run finishes there at once and counts no more, so it shows demand that no worker
the scheduler knows can meet (no workers yet, or none with the trial's tags). And
``Adaptive`` weighs placeholders against every worker's threads, not knowing that trials
occupy them: it adds workers for trials that no worker could take, not one per trial.

A placeholder cannot say "N distinct worker processes", so a waiting gang (``demand``
with ``bundles``: a trial that cannot start because its gang does not fit, or a running
trial whose ``reserve_workers`` waits) is shown another way: the executor works out
from its ledger how many workers the trial's head and bundles lack now
(:meth:`~dasktune.execution.ledger.ResourceLedger.gang_shortfall`, the rule of
:meth:`place_gang`) and tells the scheduler's
:class:`~dasktune.execution.gang_demand.GangDemandPlugin`, which adds them to
``adaptive_target``; ``withdraw`` (or the driver's shutdown) clears it.

A base class of :class:`~dasktune.execution.dask_executor.DaskExecutor`, using its state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from dasktune import gang_desk
from dasktune.execution import gang_demand, recovery
from dasktune.execution.dask_runs import cancel_run
from dasktune.execution.protocol import EventKind, ExecEvent

if TYPE_CHECKING:
    from dasktune.execution.dask_executor import DaskExecutor

__all__ = ["ClusterEvents"]

logger = logging.getLogger(__name__)

LOST, UNQUEUED = EventKind.LOST, EventKind.UNQUEUED
WORKER_LOST, WORKER_RETIRING = EventKind.WORKER_LOST, EventKind.WORKER_RETIRING
WORKER_ADDED = EventKind.WORKER_ADDED


class ClusterEvents:
    """Worker events, retirement and scale-up demand (a base of ``DaskExecutor``)."""

    # ------------------------------------------------------------ cluster events
    def watch_cluster(self: DaskExecutor) -> bool:
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

    def retire_when_free(self: DaskExecutor, addr: str) -> bool:
        """Ask Dask again to retire ``addr`` once no trial of ours and no gang is on it
        (dropping the idle actors pooled there, which would make Dask refuse)."""
        if addr in self._retiring:
            self._drop_idle(addr)
        if self.running_on(addr) or self.gangs_on(addr) or addr not in self._retiring:
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


    def lose_worker(self: DaskExecutor, addr: str) -> list[str]:
        """Mark every attempt on ``addr`` lost (told by the scheduler plugin)."""
        lost = self.running_on(addr)
        self._drop_idle(addr)
        for tid, run in self._queued.items():
            if run.worker == addr:
                self._put(ExecEvent(UNQUEUED, tid, run.spec.attempt))
        for tid in lost:
            run = self._runs[tid]
            self._put(ExecEvent(LOST, tid, run.spec.attempt, error=f"worker {addr} was lost"))
            cancel_run(run)
        self._tell_gangs(addr, gang_desk.LOST)
        self._ledger.mark_stale()
        return lost

    def _drop_idle(self: DaskExecutor, addr: str) -> None:
        """Let Dask drop the idle actors pooled on ``addr``."""
        for _key, future in self._idle.pop(addr, []):
            self._loop.call_soon_threadsafe(future.release)

    # ------------------------------------------------------------ scale-up demand
    def demand(self: DaskExecutor, trial_id: str, resources: dict[str, float],
               bundles: list[dict[str, float]] | None = None, strategy: str = "PACK") -> None:
        """Show the scheduler that ``trial_id`` waits for ``resources`` (see the module
        docs): one placeholder task per trial, however often this is called; with
        ``bundles``, its gang: the workers it lacks, worked out again at each call (the
        cluster changes while it waits). Returns at once; the scheduler is told on the
        client loop."""
        if self._closed:
            return
        if bundles and self._watching:
            self._demand_gang(trial_id, resources, bundles, strategy)
            return
        if trial_id in self._demands or trial_id in self._runs:
            return
        request = {k: float(v) for k, v in resources.items() if v > 0}
        self._demands[trial_id] = request
        self._demand_seq += 1
        # A fresh key each time: a released key may linger on the scheduler a moment.
        key = f"dasktune-demand-{trial_id}-{self._demand_seq}"
        self._loop.call_soon_threadsafe(self._submit_demand, trial_id, key, request)

    def withdraw(self: DaskExecutor, trial_id: str) -> None:
        """Release ``trial_id``'s placeholder task and its gang's demand (idempotent)."""
        if self._demands.pop(trial_id, None) is not None:
            self._loop.call_soon_threadsafe(self._release_demand, trial_id)
        if self._gang_demands.pop(trial_id, None) is not None:
            self._tell_gang_demand(trial_id, 0, [])

    def _demand_gang(self: DaskExecutor, trial_id: str, resources: dict[str, float],
                     bundles: list[dict[str, float]], strategy: str) -> None:
        """Tell the scheduler's :class:`~.gang_demand.GangDemandPlugin` how many workers
        ``trial_id``'s head and gang lack now (by the ledger, as :meth:`place_gang`
        places them; a running trial's head where it runs), when that changed."""
        run = self._runs.get(trial_id)
        lacking, keep = self._ledger.gang_shortfall(
            bundles, strategy, resources, run.worker if run is not None else None)
        known = sorted(self._ledger.workers())
        told = (lacking, keep, known)
        if self._gang_demands.get(trial_id) == told:
            return
        if not lacking and trial_id not in self._gang_demands:
            return  # it fits now: nothing to show
        self._gang_demands[trial_id] = told
        self._tell_gang_demand(trial_id, lacking, keep, known)

    def _tell_gang_demand(self: DaskExecutor, trial_id: str, workers: int, keep: list[str],
                          known: list[str] | None = None) -> None:
        self._demand_seq += 1
        msg = {"client": self.client.id, "trial": trial_id, "seq": self._demand_seq,
               "workers": workers, "keep": keep, "known": known or []}

        async def tell() -> None:
            try:
                await self.client.scheduler.log_event(topic=gang_demand.TOPIC, msg=msg)
            except Exception as exc:  # noqa: BLE001 - demand is advisory; placement goes on
                logger.debug("gang demand of %s not sent: %r", trial_id, exc)

        sent = asyncio.run_coroutine_threadsafe(tell(), self._loop)
        self._gang_sends = [f for f in self._gang_sends if not f.done()] + [sent]

    def _submit_demand(self: DaskExecutor, trial_id: str, key: str, request: dict[str, float]) -> None:
        # On the client loop, in call order with _release_demand.
        if trial_id in self._demand_futures:
            return
        try:
            self._demand_futures[trial_id] = self.client.submit(
                _waiting_trial, trial_id, key=key, resources=request or None, pure=False)
        except Exception as exc:  # noqa: BLE001 - demand is advisory; placement goes on
            logger.debug("demand for %s not submitted: %r", trial_id, exc)

    def _release_demand(self: DaskExecutor, trial_id: str) -> None:
        future = self._demand_futures.pop(trial_id, None)
        if future is not None:
            future.release()


def _waiting_trial(trial_id: str) -> str:
    """The placeholder task of :meth:`DaskExecutor.demand`: does nothing."""
    return trial_id
