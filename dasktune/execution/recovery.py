"""Fault handling on the cluster side: a scheduler plugin that reports lost and
retiring workers to the driver at once.

Dask actors have no resilience: when a worker dies its actors are gone, and a
worker that holds an actor refuses to retire. So trial state never lives only in
an actor (checkpoints and results are in storage), and this plugin tells the
driver what happened to the workers, within milliseconds rather than at the next
failed poll:

- ``remove_worker``: the worker left (SIGKILL, OOM, spot reclaim, lost network
  past ``distributed.scheduler.worker-ttl``). The driver restarts its trials on
  other workers from their newest committed checkpoints.
- a worker's status changing to ``closing_gracefully`` (``retire_workers``,
  adaptive downscaling) or ``closing`` (``Worker.close``, e.g. SIGTERM from a spot
  notice): the driver checkpoints its trials there, moves them, and then asks for
  the retirement again, which Dask refused while the actors were on the worker;
  not when the worker is ``closing`` (it closes itself once its trials left, and a
  retirement asked meanwhile would flip its status back and close it twice).

The ranks of a multi-worker trial are no actors but seceded tasks and their child
processes, which Dask would retire under them at once. So the executor keeps a
:class:`GangSlot` actor on each worker of a granted gang until the gang is released:
Dask refuses to retire that worker as it refuses one with a trial, the trial learns that
its gang's worker retires (``session.gang_retiring``), checkpoints and releases the gang,
and the driver asks for the retirement again.

A closing worker does not wait for that on its own: :class:`EvacuatePlugin`, a
worker plugin, holds ``Worker.close`` (in its ``teardown``) until the worker's
trials have checkpointed and stopped and the driver has their last reports, and the
gangs there were released, for at most ``dasktune.executor.evacuate-timeout``. Under a nanny (``dask worker``'s
default) SIGTERM closes the worker this way and the nanny kills it 8 s later (the
CLI's ``Nanny.close(timeout=10)``), so keep the timeout below that. With
``--no-nanny`` a SIGTERM gives no such chance: the trials are lost and restart from
their newest committed checkpoints.

A closing worker stays closing: Dask answers a refused retirement (one that holds an
actor, as a worker reaching ``--lifetime`` with a trial does) by sending the worker back
its old status, and when that arrives after the worker began to close it would reopen
it, so that the close ran twice and the second failed (``ConnectionPool is closed``,
logged as errors with tracebacks). :class:`EvacuatePlugin` drops such a status change.

A worker inside a batch job retires itself before the job's time limit, and any worker
before its ``--lifetime`` (:class:`~dasktune.cluster.walltime.WalltimePlugin`, installed by
:func:`register` with the others), which is the graceful path above. :func:`register` also
installs :class:`~dasktune.execution.gang_demand.GangDemandPlugin`, through which an elastic
cluster grows for the gangs that wait.

A trial whose driver is gone must not run on: its thread cannot be killed, and it
would go on committing checkpoints into the folder a restored driver's new attempt
writes to. :class:`FencePlugin`, a worker plugin, stops a trial's attempt the
moment its actor's task leaves the worker: the driver released its future (it gave
the attempt up, or it shut down), or the scheduler dropped the client that held it
(a driver killed: its connection closed). The trial stops at its next report or
step boundary, within milliseconds of the release rather than after
``dasktune.executor.orphan-timeout`` (the actor's own watchdog, kept as a fallback
for a worker that cannot hear the scheduler either).

Events go to the driver through ``log_event`` on the topic :data:`TOPIC`. The
plugin keeps no trial state of its own; it only needs ``dasktune`` importable on
the scheduler (``pip install dasktune`` there, as for any plugin).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dasktune import _dask_config
from dasktune.cluster.walltime import PLUGIN_NAME as WALLTIME_PLUGIN_NAME
from dasktune.cluster.walltime import TARGET_PLUGIN_NAME, WalltimePlugin, WalltimeTargetPlugin
from dasktune.execution.gang_demand import PLUGIN_NAME as GANG_DEMAND_PLUGIN_NAME
from dasktune.execution.gang_demand import GangDemandPlugin

if TYPE_CHECKING:
    from distributed import Scheduler, Worker

logger = logging.getLogger(__name__)

TOPIC = "dasktune-cluster"
PLUGIN_NAME = "dasktune-recovery"
WORKER_PLUGIN_NAME = "dasktune-evacuate"
FENCE_PLUGIN_NAME = "dasktune-fence"
# Worker task states in which a key is no longer held there (its actor was dropped).
_GONE_STATES = ("released", "forgotten")
_NOTICE_STATUSES = ("closing_gracefully", "closing")
_STATUS_OP = "worker-status-change"  # the scheduler's stream message that sets a status
_CLOSED = (Status.closing, Status.closed, Status.failed)  # no way back to running


class RecoveryPlugin(SchedulerPlugin):
    """Publishes worker departures and retirements on :data:`TOPIC`."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _send(self, msg: dict[str, Any]) -> None:
        if self.scheduler is not None:
            self.scheduler.log_event(TOPIC, {**msg, "time": time.time()})

    def add_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        self._send({"op": "add-worker", "worker": worker})

    def remove_worker(self, scheduler: Scheduler, worker: str, *, stimulus_id: str = "",
                      **kwargs: Any) -> None:
        self._send({"op": "remove-worker", "worker": worker, "stimulus_id": stimulus_id,
                    "expected": bool(kwargs.get("expected", False))})

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        # Worker status changes are logged on the worker's own topic (its address).
        if not isinstance(msg, dict) or msg.get("action") != "worker-status-change":
            return
        if msg.get("status") in _NOTICE_STATUSES:
            self._send({"op": "retiring", "worker": topic, "status": msg["status"]})


class GangSlot:
    """The Dask actor the executor keeps on each worker of a granted gang while the gang
    is held (see the module docs): it holds nothing but the worker's retirement."""

    def evacuated(self) -> bool:
        """Never while it exists: the executor drops it when the gang is released."""
        return False


class EvacuatePlugin(WorkerPlugin):
    """Holds a closing worker until its trials have moved off (see the module docs).

    ``teardown`` tells the driver the worker is going (the ``retiring`` event, which
    the scheduler also derives from the status change), then waits until every
    :class:`~dasktune.actor.TrialActor` there has ended and the driver has acknowledged
    its last report, and every :class:`GangSlot` there was dropped, or
    ``dasktune.executor.evacuate-timeout`` has passed. It returns
    at once on a worker with no running trial. The driver, not this plugin, stops the
    trials, so it always knows that they ended because they were moved.
    """

    idempotent = True
    name = WORKER_PLUGIN_NAME

    def setup(self, worker: Worker) -> None:
        handler = worker.stream_handlers.get(_STATUS_OP)
        if handler is not None and not getattr(handler, "keeps_closing", False):
            worker.stream_handlers[_STATUS_OP] = _keep_closing(worker, handler)

    async def teardown(self, worker: Worker) -> None:
        import asyncio

        if not _busy(worker):
            return
        try:
            worker.log_event(TOPIC, {"op": "retiring", "worker": worker.address,
                                     "status": "closing", "time": time.time()})
        except Exception:  # noqa: BLE001 - the scheduler also sees the status change
            pass
        # Default (6 s) below the 8 s a nanny gives Worker.close: the rest of close needs time.
        deadline = time.monotonic() + _dask_config.get_seconds("executor.evacuate-timeout")
        while _busy(worker) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


class FencePlugin(WorkerPlugin):
    """Stops a :class:`~dasktune.actor.TrialActor`'s attempt once its task leaves the worker.

    The worker drops an actor from ``worker.state.actors`` before it tells plugins of
    the transition, so the plugin remembers each trial actor when its task reaches
    ``memory`` (and, on setup, those already there) and fences it on the task's move to
    ``released`` or ``forgotten``. Fencing is the watchdog's path
    (:meth:`~dasktune.actor.TrialActor.fence`): a flag and a notify, so it is cheap on
    the worker's event loop, where transitions run.
    """

    idempotent = True
    name = FENCE_PLUGIN_NAME

    def __init__(self) -> None:
        self._worker: Worker | None = None
        self._actors: dict[Any, Any] = {}
        self._cls: type | None = None

    def setup(self, worker: Worker) -> None:
        # Worker side only: the scheduler, which unpickles RecoveryPlugin from this
        # module, need not import the trial machinery.
        from dasktune.actor import TrialActor

        self._worker, self._cls = worker, TrialActor
        for key, actor in list(worker.state.actors.items()):
            if isinstance(actor, TrialActor):
                self._actors[key] = actor

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any
                   ) -> None:
        if finish == "memory":
            if self._worker is None or self._cls is None:
                return
            actor = self._worker.state.actors.get(key)
            if isinstance(actor, self._cls):
                self._actors[key] = actor
        elif finish in _GONE_STATES:
            actor = self._actors.pop(key, None)
            if actor is not None:
                actor.fence(f"its task {key!r} went from {start} to {finish} on the worker")

    def teardown(self, worker: Worker) -> None:
        # Not a fence: a closing worker's trials are moved by the driver (EvacuatePlugin).
        self._actors.clear()


def _keep_closing(worker: Worker, handler: Any) -> Any:
    """``handler`` of the scheduler's ``worker-status-change``, less the changes that
    would take a closing worker back (see the module docs): a closing worker never runs
    again, and the scheduler learns its status from the worker's own report."""

    def handle(status: str, stimulus_id: str, **kwargs: Any) -> None:
        if worker.status in _CLOSED:
            logger.debug("%s is closing: ignoring the status change to %s (%s)",
                         worker.address, status, stimulus_id)
            return
        handler(status=status, stimulus_id=stimulus_id, **kwargs)

    handle.keeps_closing = True  # type: ignore[attr-defined]
    return handle


def _busy(worker: Worker) -> bool:
    """Whether a trial on ``worker`` still runs or holds reports the driver lacks, or a
    gang there is still held."""
    from dasktune.actor import TrialActor

    return any(isinstance(a, (TrialActor, GangSlot)) and not a.evacuated()
               for a in list(worker.state.actors.values()))


def register(client: Any) -> bool:
    """Install the plugins on ``client``'s cluster; False (and a warning) if the scheduler's
    can't be (a worker plugin that can't be installed only warns)."""
    try:
        client.register_plugin(RecoveryPlugin(), name=PLUGIN_NAME)
    except Exception as exc:  # noqa: BLE001 - fall back to detection by failed polls
        logger.warning(
            "could not register the dasktune recovery plugin on the scheduler (%r); lost "
            "workers are noticed at the next failed poll instead. Install dasktune where the "
            "scheduler runs.", exc)
        return False
    try:
        client.register_plugin(EvacuatePlugin(), name=WORKER_PLUGIN_NAME)
    except Exception as exc:  # noqa: BLE001 - closing workers then lose their trials
        logger.warning(
            "could not register the dasktune evacuate plugin on the workers (%r); a worker "
            "that closes (e.g. on SIGTERM) loses its trials instead of moving them.", exc)
    try:
        client.register_plugin(FencePlugin(), name=FENCE_PLUGIN_NAME)
    except Exception as exc:  # noqa: BLE001 - the actors' orphan watchdog still stops them
        logger.warning(
            "could not register the dasktune fence plugin on the workers (%r); a trial "
            "whose driver is gone stops only after dasktune.executor.orphan-timeout.", exc)
    try:
        client.register_plugin(WalltimeTargetPlugin(), name=TARGET_PLUGIN_NAME)
        client.register_plugin(WalltimePlugin(), name=WALLTIME_PLUGIN_NAME)
    except Exception as exc:  # noqa: BLE001 - then --lifetime is the only warning
        logger.warning(
            "could not register the dasktune walltime plugin on the workers (%r); workers "
            "in batch jobs lose their trials at the job's time limit, and function "
            "trainables the iterations since their last checkpoint at a worker's "
            "--lifetime.", exc)
    try:
        client.register_plugin(GangDemandPlugin(), name=GANG_DEMAND_PLUGIN_NAME)
    except Exception as exc:  # noqa: BLE001 - gangs then show only their trials' demand
        logger.warning(
            "could not register the dasktune gang-demand plugin on the scheduler (%r); an "
            "adaptive cluster does not grow for the workers a trial's gang needs.", exc)
    return True
