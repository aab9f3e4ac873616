"""Scale-up demand of waiting gangs: how many more worker processes an elastic cluster
must add for them, on the scheduler.

A trial that waits for resources is shown to Dask's ``Adaptive`` as a placeholder task
(:meth:`~dasktune.execution.dask_executor.DaskExecutor.demand`), but a placeholder that
any worker can run finishes at once: it can never say "this trial needs N distinct
worker processes". So for a gang (a trial's head and its bundles, all or none, each
bundle on a worker process of its own) the executor works out itself, from its ledger
and by the placement rule of its gangs, how many workers the cluster lacks for it now,
and sends that here with ``log_event`` on :data:`TOPIC`, one message per change:
``{"client", "trial", "seq", "workers", "keep", "known"}``. :class:`GangDemandPlugin`
adds those workers to the scheduler's ``adaptive_target``
(:func:`~dasktune.cluster.adaptive_target.add_to_adaptive_target`) until the trial's
demand is withdrawn (``"workers": 0``: it started, its request was granted or
withdrawn, it ended, the driver shut down) or its client left the scheduler.

- ``known``: the workers the executor counted with. Each worker that joined since counts
  against the shortfall, so the target does not overshoot while the driver has not
  looked again; and it is not picked for scale-down before the driver placed the gang.
- ``keep``: the workers the gang would use; never picked for scale-down while it waits
  (once granted, each gang worker holds a
  :class:`~dasktune.execution.recovery.GangSlot` actor, which Dask's scale-down skips).
- ``seq``: messages may arrive out of order over the client's pooled connections; an
  older one than the last seen for its trial is ignored.

Installed by :func:`dasktune.execution.recovery.register` with the other plugins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dasktune.cluster.adaptive_target import add_to_adaptive_target

__all__ = ["PLUGIN_NAME", "TOPIC", "GangDemandPlugin"]

PLUGIN_NAME = "dasktune-gang-demand"
TOPIC = "dasktune-gang-demand"


@dataclass(frozen=True)
class _Want:
    workers: int
    keep: frozenset[str]
    known: frozenset[str]


class GangDemandPlugin(SchedulerPlugin):
    """Adds the workers waiting gangs lack to ``adaptive_target`` (see the module docs)."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.scheduler: Any = None
        self._wants: dict[tuple[str, str], _Want] = {}  # (client, trial) -> its demand
        self._seq: dict[tuple[str, str], int] = {}

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_to_adaptive_target(scheduler, self.workers_wanted)

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        if topic != TOPIC or not isinstance(msg, dict) or not msg.get("trial"):
            return
        key = (str(msg.get("client", "")), str(msg["trial"]))
        seq = int(msg.get("seq", 0))
        if seq <= self._seq.get(key, -1):
            return  # overtaken by a newer message
        self._seq[key] = seq
        workers = int(msg.get("workers", 0))
        if workers > 0:
            self._wants[key] = _Want(workers, frozenset(msg.get("keep", ())),
                                     frozenset(msg.get("known", ())))
        else:
            self._wants.pop(key, None)

    def remove_client(self, scheduler: Any, client: str, **kwargs: Any) -> None:
        # A driver gone without withdrawing: its gangs wait no more.
        for key in [k for k in self._seq if k[0] == client]:
            self._seq.pop(key, None)
            self._wants.pop(key, None)

    def workers_wanted(self) -> int:
        """The workers the waiting gangs lack, less those that joined since each was
        counted."""
        live = set(self.scheduler.workers) if self.scheduler is not None else set()
        return sum(max(0, w.workers - len(live - w.known)) for w in self._wants.values())

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        if not self._wants:
            return workers
        live = set(scheduler.workers)
        held = set().union(*(w.keep | (live - w.known) for w in self._wants.values()))
        return [ws for ws in workers if ws.address not in held]
