"""Resource changing: a wrapper scheduler that resizes live trials between their steps.

:class:`ResourceChangingScheduler` passes every decision of the scheduler it wraps through;
where that is CONTINUE, it asks a ``resources_allocation_function`` for the trial's new
resources, and when they differ answers :class:`~dasktune.schedulers.Reconfigure`: the
driver checkpoints and pauses the trial, and starts it again from that checkpoint, placed
with its new resources (which it reads from ``tune.get_context().get_trial_resources()``).
:class:`DistributeResources` and :class:`DistributeResourcesToTopJob` are Ray's two
allocation functions. A trial runs as one actor on one worker, so its bundles are summed.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dasktune.config import PlacementGroupFactory
from dasktune.metric_mode import check_mode
from dasktune.resources import normalize_request
from dasktune.schedulers._base import Reconfigure, TrialScheduler
from dasktune.schedulers._fifo import FIFOScheduler

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["DistributeResources", "DistributeResourcesToTopJob", "ResourceChangingScheduler"]

logger = logging.getLogger(__name__)

AllocationFunction = Callable[
    ["SchedulerContext", "Trial", dict, "ResourceChangingScheduler"],
    "PlacementGroupFactory | Mapping[str, float] | None"]


def _workers(ctx: SchedulerContext) -> list[dict[str, float]]:
    """Each live worker's resources, busy or not."""
    workers = getattr(ctx, "worker_resources", None)
    if workers is None:
        raise TypeError("ResourceChangingScheduler needs a scheduler context that knows the "
                        "workers' resources (worker_resources()); the driver's has it")
    return list(workers().values())


class DistributeResources:
    """Ray's ``DistributeResources``: share the cluster's CPUs (or GPUs) evenly.

    Every live trial may grow, one ``increase_by`` unit at a time, while resources are free,
    up to its share of a clean-slate even split (the first trials of a round-robin take the
    remainder); when more are in use than the cluster has, it shrinks, never below the
    resources the trials started with (``base_trial_resources``).

    Args:
        add_bundles: grow by adding ``increase_by`` bundles (default: grow the first one).
        increase_by: the unit of growth, e.g. ``{"CPU": 2}`` (default: 1 GPU if trials ask
            for GPUs, else 1 CPU; with ``add_bundles``, the base's last bundle).
        increase_by_times: at most this many units on top of the base (< 1: no limit).
        reserve_resources: kept out of the share, e.g. ``{"CPU": 1}``.
    """

    def __init__(self, add_bundles: bool = False,
                 increase_by: Mapping[str, float] | None = None,
                 increase_by_times: int = -1,
                 reserve_resources: Mapping[str, float] | None = None):
        self.add_bundles = add_bundles
        self.increase_by = dict(increase_by or {})
        if self.increase_by and not (self.increase_by.get("CPU", 0) > 0
                                     or self.increase_by.get("GPU", 0) > 0):
            raise ValueError(f"increase_by must add some CPU or GPU, got {increase_by!r}")
        if any(v < 0 for v in self.increase_by.values()):
            raise ValueError(f"increase_by amounts must be >= 0, got {increase_by!r}")
        self.increase_by_times = increase_by_times
        self.reserve_resources = dict(reserve_resources or {})
        self.metric: str | None = None
        self.mode: str | None = None

    # ---------------------------------------------------------------- pieces
    def _unit(self, base: PlacementGroupFactory) -> dict[str, float]:
        if self.increase_by:
            return dict(self.increase_by)
        if self.add_bundles:
            return dict(base.bundles[-1])
        return {"GPU": 1.0} if base.bundles[0].get("GPU", 0) else {"CPU": 1.0}

    @staticmethod
    def _units_in(unit: Mapping[str, float], cpus: float, gpus: float) -> int:
        """How many ``unit``s ``cpus`` and ``gpus`` hold (negative when they are short)."""
        counts = [math.floor(amount / unit[key]) for key, amount in (("CPU", cpus),
                                                                     ("GPU", gpus))
                  if unit.get(key, 0) > 0]
        return int(min(counts))

    def _added_units(self, trial: Trial, base: PlacementGroupFactory,
                     unit: Mapping[str, float]) -> int:
        have = trial.resources
        extra = [(have.get(k, 0.0) - base.required_resources.get(k, 0.0)) / unit[k]
                 for k in ("CPU", "GPU") if unit.get(k, 0) > 0]
        return max(0, int(round(min(extra))))

    def _limit(self) -> float:
        return self.increase_by_times if self.increase_by and self.increase_by_times > 0 \
            else math.inf

    def _resize(self, current: int, free_units: int, cap: float) -> int:
        """Units after taking ``free_units`` (giving some back when negative), at most
        ``cap`` when growing."""
        if free_units > 0:
            return int(min(current + free_units, cap))
        if free_units < 0:
            return max(current + free_units, 0)
        return current

    def _factory(self, base: PlacementGroupFactory, unit: Mapping[str, float],
                 units: int) -> PlacementGroupFactory:
        bundles = copy.deepcopy(base.bundles)
        if self.add_bundles:
            bundles += [dict(unit) for _ in range(units)]
        else:
            for key, amount in unit.items():
                bundles[0][key] = bundles[0].get(key, 0.0) + amount * units
        return PlacementGroupFactory(bundles, strategy=base.strategy)

    def _new_units(self, ctx: SchedulerContext, trial: Trial, base: PlacementGroupFactory,
                   unit: Mapping[str, float], cpus: float, gpus: float,
                   free_units: int) -> int:
        """Even shares: at most ``ceil(spare units / live trials)`` each."""
        live = ctx.get_live_trials()
        spare = self._units_in(unit, cpus - base.required_resources.get("CPU", 0) * len(live),
                               gpus - base.required_resources.get("GPU", 0) * len(live))
        share = math.ceil(max(spare, 0) / max(len(live), 1))
        return self._resize(self._added_units(trial, base, unit), free_units,
                            min(share, self._limit()))

    # ---------------------------------------------------------------- call
    def __call__(self, tune_controller: SchedulerContext, trial: Trial, result: dict[str, Any],
                 scheduler: ResourceChangingScheduler) -> PlacementGroupFactory | None:
        base = scheduler.base_trial_resources
        if base is None:
            base = PlacementGroupFactory([{"CPU": 1, "GPU": 0}])
        if not self.add_bundles and len(base.bundles) > 1:
            raise ValueError("If add_bundles is False, the trials' resources must be one "
                             f"bundle (got {len(base.bundles)})")
        if result.get("training_iteration", 0) < 1:
            return None
        unit = self._unit(base)
        workers = _workers(tune_controller)
        cpus = sum(w.get("CPU", 0.0) for w in workers) - self.reserve_resources.get("CPU", 0)
        gpus = sum(w.get("GPU", 0.0) for w in workers) - self.reserve_resources.get("GPU", 0)
        used_c = sum(t.resources.get("CPU", 0.0) for t in tune_controller.get_live_trials())
        used_g = sum(t.resources.get("GPU", 0.0) for t in tune_controller.get_live_trials())
        free_units = self._units_in(unit, cpus - used_c, gpus - used_g)
        units = self._new_units(tune_controller, trial, base, unit, cpus, gpus, free_units)
        # A trial runs on one worker: never more than the largest one offers.
        need = base.required_resources
        fits = [self._units_in(unit, w.get("CPU", 0.0) - need.get("CPU", 0.0),
                               w.get("GPU", 0.0) - need.get("GPU", 0.0)) for w in workers]
        return self._factory(base, unit, max(0, min(units, max(fits, default=0))))


class DistributeResourcesToTopJob(DistributeResources):
    """Ray's ``DistributeResourcesToTopJob``: every free resource goes to the best trial.

    The best live trial (by ``metric`` and ``mode``, else the wrapped scheduler's, else
    ``TuneConfig``'s) that is below ``increase_by_times`` takes all that is free; others
    keep what they have, and give some back only when more is in use than the cluster
    has. Arguments as :class:`DistributeResources`, plus ``metric`` and ``mode``.
    """

    def __init__(self, add_bundles: bool = False,
                 increase_by: Mapping[str, float] | None = None,
                 increase_by_times: int = -1,
                 reserve_resources: Mapping[str, float] | None = None,
                 metric: str | None = None, mode: str | None = None):
        super().__init__(add_bundles, increase_by, increase_by_times, reserve_resources)
        check_mode(mode, "DistributeResourcesToTopJob")
        self.metric = metric
        self.mode = mode

    def _new_units(self, ctx: SchedulerContext, trial: Trial, base: PlacementGroupFactory,
                   unit: Mapping[str, float], cpus: float, gpus: float,
                   free_units: int) -> int:
        if self.metric is None or self.mode is None:
            raise ValueError("DistributeResourcesToTopJob needs a metric and a mode: set them "
                             "here, on the wrapped scheduler or in TuneConfig")
        op = 1.0 if self.mode == "max" else -1.0

        def score(t: Trial) -> float:
            value = t.last_result.get(self.metric)
            return op * float(value) if isinstance(value, (int, float)) else -math.inf

        ranked = sorted(ctx.get_live_trials(), key=score, reverse=True)
        limit = self._limit()
        best = next((t for t in ranked if self._added_units(t, base, unit) < limit),
                    ranked[0] if ranked else trial)
        current = self._added_units(trial, base, unit)
        if trial.trial_id != best.trial_id and free_units >= 0:
            return current  # not the top job: it only gives back what is over-committed
        return self._resize(current, free_units, limit)


class ResourceChangingScheduler(TrialScheduler):
    """Ray's ``ResourceChangingScheduler``: change live trials' resources between steps.

    Wraps ``base_scheduler`` (default FIFO), whose decisions it passes on. After each
    result the base answers CONTINUE to, it calls ``resources_allocation_function(
    tune_controller, trial, result, scheduler)``; a returned
    :class:`~dasktune.PlacementGroupFactory` (or resource dict) unlike the trial's current
    resources is answered with :class:`~dasktune.schedulers.Reconfigure`: the trial is
    checkpointed, paused and started again from that checkpoint with the new resources,
    placed on a worker where they fit. A function trainable reads them with
    ``tune.get_context().get_trial_resources()`` after the restore, so it must checkpoint
    (preferably every iteration) and resume from ``tune.get_checkpoint()``.

    ``tune_controller`` here is the scheduler context: ``get_live_trials()``,
    ``worker_resources()`` and Ray's ``_resource_updater.get_num_cpus()`` / ``get_num_gpus()``
    (the cluster's totals, busy or not). All trials must start with the same resources
    (:attr:`base_trial_resources`). A trial runs on one worker, so a request beyond what
    the largest worker offers is cut down to it (Ray can spread bundles over nodes).
    ``TuneConfig(reuse_actors=True)`` is refused with it, as in Ray.
    """

    def __init__(self, base_scheduler: TrialScheduler | None = None,
                 resources_allocation_function: AllocationFunction | None =
                 DistributeResources(add_bundles=False)):
        super().__init__()
        if resources_allocation_function is None:
            warnings.warn("resources_allocation_function is None: no trial's resources will "
                          "change. Pass an allocation function (e.g. DistributeResources()).",
                          stacklevel=2)
        elif not callable(resources_allocation_function):
            raise TypeError(f"resources_allocation_function must be callable, got "
                            f"{resources_allocation_function!r}")
        # Its own copy: the default instance is shared, and metric/mode get set on it.
        self._resources_allocation_function = copy.copy(resources_allocation_function)
        self._base_scheduler = base_scheduler or FIFOScheduler()
        self._base_trial_resources: PlacementGroupFactory | None = None
        self._reallocated_trial_ids: set[str] = set()

    _state_attrs = ("_base_trial_resources", "_reallocated_trial_ids")
    allows_reuse_actors = False  # Ray's rule: a resized trial starts a new actor

    # ---------------------------------------------------------------- metric
    @property
    def time_attr(self) -> str | None:
        return self._base_scheduler.time_attr

    @property
    def metric(self) -> str | None:
        return self._base_scheduler.metric

    @property
    def mode(self) -> str | None:
        return self._base_scheduler.mode

    @property
    def base_trial_resources(self) -> PlacementGroupFactory | None:
        """The first trial's resources, which every trial starts with."""
        return self._base_trial_resources

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        self._metric, self._mode = metric, mode
        return self._base_scheduler.set_search_properties(metric, mode, **spec)

    # ---------------------------------------------------------------- hooks
    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        resources = PlacementGroupFactory([dict(trial.resources)])
        if self._base_trial_resources is None:
            self._base_trial_resources = resources
        elif trial.trial_id not in self._reallocated_trial_ids and \
                resources.required_resources != self._base_trial_resources.required_resources:
            raise RuntimeError(
                f"ResourceChangingScheduler needs every trial to start with the same "
                f"resources: the first had {self._base_trial_resources.required_resources}, "
                f"trial {trial.trial_id} has {resources.required_resources}")
        self._base_scheduler.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._base_scheduler.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> Any:
        decision = self._base_scheduler.on_trial_result(tune_controller, trial, result)
        if decision != self.CONTINUE:
            return decision
        new = self.reallocate_trial_resources_if_needed(tune_controller, trial, result)
        if new is None:
            return decision
        self._reallocated_trial_ids.add(trial.trial_id)
        logger.info("ResourceChangingScheduler: trial %s resources %s -> %s", trial.trial_id,
                    trial.resources, new)
        return Reconfigure(resources=new)

    def on_trial_complete(self, tune_controller: SchedulerContext, trial: Trial,
                          result: dict[str, Any]) -> None:
        self._base_scheduler.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._base_scheduler.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: SchedulerContext) -> Trial | None:
        return self._base_scheduler.choose_trial_to_run(tune_controller)

    def trials_to_stop(self, tune_controller: SchedulerContext) -> list[Trial]:
        return self._base_scheduler.trials_to_stop(tune_controller)

    def debug_string(self) -> str:
        return f"(ResourceChangingScheduler) {self._base_scheduler.debug_string()}"

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "_base": self._base_scheduler.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "_base" in state:
            self._base_scheduler.set_state(state["_base"])

    # ---------------------------------------------------------------- allocation
    def reallocate_trial_resources_if_needed(self, tune_controller: SchedulerContext,
                                             trial: Trial, result: dict[str, Any]
                                             ) -> dict[str, float] | None:
        """The allocation function's resources for ``trial`` as Dask resource tags, or
        None when it returns None or what the trial has."""
        fn = self._resources_allocation_function
        if fn is None:
            return None
        # A function that ranks trials (DistributeResourcesToTopJob) falls back to the
        # wrapped scheduler's metric and mode, then TuneConfig's.
        if getattr(fn, "metric", "absent") is None:
            fn.metric = self._base_scheduler.metric or self._metric
        if getattr(fn, "mode", "absent") is None:
            fn.mode = self._base_scheduler.mode or self._mode
        new = fn(tune_controller, trial, result, self)
        if new is None:
            return None
        if isinstance(new, PlacementGroupFactory):
            new = new.required_resources
        if not isinstance(new, Mapping):
            raise TypeError(f"resources_allocation_function must return a "
                            f"PlacementGroupFactory, a resource dict or None, got {new!r}")
        request = self._fit_one_worker(tune_controller, normalize_request(new))
        if request is None or request == normalize_request(trial.resources):
            return None
        return request

    @staticmethod
    def _fit_one_worker(ctx: SchedulerContext, request: dict[str, float]
                        ) -> dict[str, float] | None:
        """``request`` cut down to what the largest worker offers of each resource (a trial
        runs on one worker, where Ray may spread bundles over nodes), or None if no worker
        can hold the result."""
        workers = _workers(ctx)
        if not workers:
            return request  # none yet: an elastic cluster may add some
        most = {k: max(w.get(k, 0.0) for w in workers) for k in request}
        cut = {k: min(v, most[k]) if most[k] > 0 else v for k, v in request.items()}
        if not any(all(w.get(k, 0.0) >= v for k, v in cut.items() if v > 0) for w in workers):
            return None
        if cut != request:
            logger.info("ResourceChangingScheduler: %s cut to %s, what one worker offers",
                        request, cut)
        return cut
