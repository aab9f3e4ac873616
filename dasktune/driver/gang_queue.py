"""The driver's gang decisions: which trial's request for workers is granted, and when.

Trials ask for several workers at once (``dasktune.session.reserve_workers``); the
requests arrive as WORKERS_WANTED events and wait here, first come first served: the
first request that does not fit now holds back every later one *and* the start of new
trials, so a big gang is never starved by smaller ones. A request that can never fit is
refused at once (the trial's call raises ValueError).

The experiment's gang shape: once any trial asked for bundles B (or the trainable
declared them up front, ``tune.with_resources(fn, ScalingConfig(...))``), the driver
starts a trial only where its head and B fit together, and reserves B with it
(:meth:`GangQueue.start_group`): a trial never starts only to wait for workers, so
``max_concurrent_trials`` needs no hand-tuning. One shape per experiment, the first
one asked: a trial that asks for another gives the reserved gang back and waits its turn.

On an elastic cluster (``can_scale``) a request that the workers here can never hold is
not refused but waits for more, and the first waiting request is shown to the cluster
as demand (``executor.demand`` with its bundles), withdrawn once granted or forgotten.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dasktune.execution.gang_placement import check_strategy
from dasktune.resources import normalize_request

if TYPE_CHECKING:
    from dasktune.execution import Executor, GangRequest, WorkerGang
    from dasktune.trial import Trial

__all__ = ["GangQueue", "GangShape", "note_gang", "split_gang_request"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GangShape:
    """The workers each trial of the experiment asks for, besides its own slot."""

    bundles: list[dict[str, float]]
    strategy: str = "PACK"


def split_gang_request(request: Any) -> tuple[Any, GangShape | None]:
    """A trainable's resource request as (the trial's own request, its gang shape).

    An object with ``as_placement_group_factory()`` (``dasktune.train.ScalingConfig``)
    gives Ray's convention: bundle 0 is the trial's (the head), bundles 1.. its gang. Any
    other request (a dict, a callable, a plain ``PlacementGroupFactory``, summed on one
    worker) has no gang.
    """
    make = getattr(request, "as_placement_group_factory", None)
    if make is None:
        return request, None
    pgf = make()
    head, rest = pgf.bundles[0], pgf.bundles[1:]
    if not rest:
        return head, None
    return head, GangShape([normalize_request(b) for b in rest], check_strategy(pgf.strategy))


class GangQueue:
    """Waiting gang requests in arrival order, and the experiment's gang shape."""

    def __init__(self, executor: Executor, shape: GangShape | None = None,
                 can_scale: bool = False):
        self.executor = executor
        self.shape = shape
        self.can_scale = can_scale
        self._told: set[str] = set()  # requests said to wait for the cluster to grow
        self._waiting: list[tuple[Trial, GangRequest]] = []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def want(self, trial: Trial, request: GangRequest) -> bool:
        """``trial`` waits for ``request``; True if this taught the driver the shape."""
        self._waiting.append((trial, request))
        if self.shape is None:
            self.shape = GangShape([dict(b) for b in request.bundles], request.strategy)
            logger.info("trials of this experiment ask for %d workers each: new trials start "
                        "only where those fit too", len(request.bundles))
            return True
        return False

    def withdraw(self, trial_id: str, request_id: str | None = None) -> None:
        """Forget ``trial_id``'s request (all of them, without ``request_id``)."""
        before = len(self._waiting)
        self._waiting = [(t, r) for t, r in self._waiting
                         if t.trial_id != trial_id or
                         (request_id is not None and r.request_id != request_id)]
        if len(self._waiting) < before:
            self.executor.withdraw(trial_id)  # its gang waits no more

    def grant_waiting(self) -> bool:
        """Grant the waiting requests in order while they fit; True if some still wait."""
        while self._waiting:
            trial, request = self._waiting[0]
            why = self.executor.can_ever_fit_gang(request.bundles, request.strategy,
                                                  head=trial.resources)
            if why is not None and not self.can_scale:  # an elastic cluster may grow
                self._waiting.pop(0)
                self.executor.refuse_workers(
                    trial.trial_id, request.request_id,
                    f"trial {trial.trial_id}'s workers can never be placed: {why}")
                continue
            if why is not None and request.request_id not in self._told:
                self._told.add(request.request_id)
                logger.info("trial %s's workers cannot be placed on the workers here (%s); "
                            "it waits for the cluster to grow", trial.trial_id, why)
            head_worker = trial.placements[-1].worker if trial.placements else None
            group = self.executor.place_gang(request.bundles, request.strategy,
                                             head=trial.resources, head_worker=head_worker)
            if group is None:
                if self.can_scale:  # show an elastic cluster the workers it lacks
                    self.executor.demand(trial.trial_id, trial.resources, request.bundles,
                                         request.strategy)
                return True
            self._waiting.pop(0)
            self.executor.withdraw(trial.trial_id)
            gang = self.executor.grant_workers(trial.trial_id, request.bundles,
                                               request.strategy, group[1:],
                                               request.request_id)
            note_gang(trial, gang)
        return False

    def place(self, trial: Trial) -> list[str] | None:
        """Where ``trial`` and the experiment's gang fit now: its worker first."""
        assert self.shape is not None
        return self.executor.place_gang(self.shape.bundles, self.shape.strategy,
                                        head=trial.resources)

    def never_fits(self, trial: Trial) -> str | None:
        """Why ``trial`` with the experiment's gang can never be placed, or None."""
        assert self.shape is not None
        return self.executor.can_ever_fit_gang(self.shape.bundles, self.shape.strategy,
                                               head=trial.resources)

    def start_group(self, trial: Trial, workers: list[str]) -> WorkerGang:
        """Reserve the experiment's gang on ``workers`` for ``trial``'s next attempt."""
        assert self.shape is not None
        return self.executor.grant_workers(trial.trial_id, self.shape.bundles,
                                           self.shape.strategy, workers)


def note_gang(trial: Trial, gang: WorkerGang | None) -> None:
    """The dashboard shows the gang with the attempt it serves (None: it is gone)."""
    if trial.placements:
        placement = trial.placements[-1]
        placement.gang = list(gang.workers) if gang is not None else []
        placement.gang_start = time.time() if gang is not None else None
