"""Population Based Training: bad trials copy a good trial's checkpoint and perturb its config."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dasktune.schedulers._base import Exploit, TrialScheduler, finite, result_value
from dasktune.schedulers._pbt_explore import explore, missing_keys, validate_mutations
from dasktune.trial import PAUSED, PENDING

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["PopulationBasedTraining"]

logger = logging.getLogger(__name__)


@dataclass
class _TrialState:
    last_score: float | None = None  # op * metric: higher is better
    last_perturbation_time: float = 0.0
    last_train_time: float = 0.0
    pending_exploit: Exploit | None = None  # synch mode: applied at the trial's next result
    yielded_at: int = 0  # when it last gave up its slot (paused or exploited), in decisions
    orig_tag: str = ""  # the experiment tag when added (Ray's policy logs name trials so)


class PopulationBasedTraining(TrialScheduler):
    """Ray's ``PopulationBasedTraining``.

    Every ``perturbation_interval`` of ``time_attr``, a trial in the bottom
    ``quantile_fraction`` (by its latest score) is answered with an :class:`Exploit`: the
    driver restarts it from the newest checkpoint of a random top-quantile trial, with that
    trial's config explored (see :func:`~dasktune.schedulers._pbt_explore.explore`). Trials
    must checkpoint at least as often as they perturb; a donor without one raises.

    Args mirror Ray's. ``hyperparam_mutations`` values may be lists, search space domains
    (``tune.uniform(...)``), callables, or dicts of these for nested configs. ``synch=True``
    pauses trials at each interval until all live ones reach it; bottom trials then exploit at
    their next result. ``seed`` (dasktune only) makes donor choice and exploration
    reproducible; Ray uses the global RNG.

    ``log_config``: every exploit is kept in :attr:`perturbations` and, when the context
    has a ``storage`` (the experiment's :class:`~dasktune.storage.ExperimentStorage`), written
    as Ray does: a JSON line ``[tag, donor tag, iteration, donor iteration, donor config, new
    config]`` appended to ``pbt_global.txt`` and to ``pbt_policy_<trial_id>.txt`` (which first
    takes over the donor's policy file) in the experiment folder.
    """

    _state_attrs = ("_trial_state", "_next_perturbation_sync", "_num_perturbations",
                    "_perturbations", "_rng_state", "_yields")

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: tuple[float, float] = (1.2, 0.8),
        custom_explore_fn: Callable[[dict], dict] | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        *,
        seed: int | None = None,
    ):
        super().__init__(metric, mode)
        name = type(self).__name__
        mutations = dict(hyperparam_mutations or {})
        if not mutations and custom_explore_fn is None:
            raise ValueError(f"{name}: give hyperparam_mutations or custom_explore_fn (or both)")
        if custom_explore_fn is not None and not callable(custom_explore_fn):
            raise TypeError(f"{name}: custom_explore_fn must be callable, got "
                            f"{custom_explore_fn!r}")
        validate_mutations(mutations)
        if not 0 <= quantile_fraction <= 0.5:
            raise ValueError(f"{name}: quantile_fraction must be in [0, 0.5], got "
                             f"{quantile_fraction!r}")
        if not perturbation_interval > 0:
            raise ValueError(f"{name}: perturbation_interval must be positive, got "
                             f"{perturbation_interval!r}")
        if not 0 <= resample_probability <= 1:
            raise ValueError(f"{name}: resample_probability must be in [0, 1], got "
                             f"{resample_probability!r}")
        if not perturbation_factors:
            raise ValueError(f"{name}: perturbation_factors must not be empty")
        self._time_attr = time_attr
        self._perturbation_interval = perturbation_interval
        self._burn_in_period = burn_in_period
        self._hyperparam_mutations = mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._perturbation_factors = tuple(perturbation_factors)
        self._custom_explore_fn = custom_explore_fn
        self._log_config = log_config
        self._require_attrs = require_attrs
        self._synch = synch
        self._rng = random.Random(seed)
        self._trial_state: dict[str, _TrialState] = {}
        self._next_perturbation_sync = perturbation_interval
        self._num_perturbations = 0
        self._yields = 0
        # (time, target, donor, old config, new config, operations), when log_config is set.
        self._perturbations: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ state
    @property
    def _rng_state(self) -> Any:
        return self._rng.getstate()

    @_rng_state.setter
    def _rng_state(self, value: Any) -> None:
        self._rng.setstate(value)

    # ------------------------------------------------------------------ hooks
    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._require_metric()
        missing = missing_keys(trial.config, self._hyperparam_mutations)
        if missing:
            raise ValueError(
                f"{type(self).__name__}: hyperparam_mutations key(s) {missing} not in the "
                f"config of trial {trial.trial_id} (config keys: {sorted(trial.config)}); "
                f"add them to the param_space")
        state = self._trial_state.setdefault(trial.trial_id, _TrialState())
        state.orig_tag = state.orig_tag or trial.experiment_tag

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str | Exploit:
        decision = self._decide(tune_controller, trial, result)
        if decision is not self.CONTINUE:
            self._yields += 1
            self._state(trial).yielded_at = self._yields
        return decision

    def _decide(self, tune_controller: SchedulerContext, trial: Trial,
                result: dict[str, Any]) -> str | Exploit:
        self._require_metric()
        name = type(self).__name__
        if result.get("done"):
            # Its last result (a stop criterion or the trainable ended it): Ray's driver does
            # not ask the scheduler then, so no exploit is decided (and logged) that the
            # driver would override with the stop.
            return self.CONTINUE
        if not self._require_attrs and (self._time_attr not in result
                                        or self._metric not in result):
            return self.CONTINUE
        t = float(result_value(result, self._time_attr, trial, name))
        value = result_value(result, self._metric, trial, name)
        state = self._trial_state.setdefault(trial.trial_id, _TrialState())
        if state.pending_exploit is not None:
            decision, state.pending_exploit = state.pending_exploit, None
            return decision
        if t < self._burn_in_period:
            return self.CONTINUE
        if t - state.last_perturbation_time < self._perturbation_interval:
            return self.CONTINUE
        state.last_score = self._metric_op * float(value) if finite(value) else None
        state.last_train_time = t
        self._on_perturbation_step(trial, t, state.last_score)
        if not self._synch:
            state.last_perturbation_time = t
            lower, upper = self._quantiles(tune_controller)
            decision = self._maybe_exploit(tune_controller, trial, lower, upper)
            if decision is not None:
                return decision
            # Let queued trials have a turn (time multiplexing, as Ray does).
            waiting = any(o.status in (PENDING, PAUSED) for o in tune_controller.get_trials()
                          if o.trial_id != trial.trial_id)
            return self.PAUSE if waiting else self.CONTINUE
        return self._synch_result(tune_controller, trial, t)

    def _synch_result(self, ctx: SchedulerContext, trial: Trial, t: float) -> str | Exploit:
        live = [o for o in ctx.get_trials() if not o.is_finished]
        behind = [o for o in live if o.trial_id != trial.trial_id
                  and self._state(o).last_train_time < self._next_perturbation_sync]
        if behind:
            return self.PAUSE
        lower, upper = self._quantiles(ctx)
        decision: str | Exploit = self.CONTINUE
        for other in live:
            self._state(other).last_perturbation_time = t
            exploit = self._maybe_exploit(ctx, other, lower, upper)
            if exploit is None:
                continue
            if other.trial_id == trial.trial_id:
                decision = exploit
            else:
                self._state(other).pending_exploit = exploit
        times = [self._state(o).last_train_time for o in live]
        self._next_perturbation_sync = max(
            self._next_perturbation_sync + self._perturbation_interval, max(times))
        return decision

    def _state(self, trial: Trial) -> _TrialState:
        return self._trial_state.setdefault(trial.trial_id, _TrialState())

    def _quantiles(self, ctx: SchedulerContext) -> tuple[list[Trial], list[Trial]]:
        """(bottom, top) trials by latest score, each ``quantile_fraction`` of the scored ones."""
        scored = [t for t in ctx.get_trials() if not t.is_finished
                  and self._state(t).last_score is not None]
        scored.sort(key=lambda t: self._state(t).last_score)  # type: ignore[arg-type,return-value]
        if len(scored) <= 1:
            return [], []
        n = int(math.ceil(len(scored) * self._quantile_fraction))
        n = min(n, len(scored) // 2)
        if n == 0:
            return [], []
        return scored[:n], scored[-n:]

    def _maybe_exploit(self, ctx: SchedulerContext, trial: Trial, lower: list[Trial],
                       upper: list[Trial]) -> Exploit | None:
        if trial not in lower:
            return None
        donor = self._rng.choice(upper)
        if not donor.checkpoint:
            raise ValueError(
                f"{type(self).__name__}: trial {donor.trial_id} was chosen to be cloned by "
                f"trial {trial.trial_id} but has no checkpoint; PBT needs trials that save "
                f"checkpoints (tune.report(..., checkpoint=...) and "
                f"CheckpointConfig(checkpoint_frequency=...)) at least every "
                f"perturbation_interval={self._perturbation_interval} {self._time_attr}")
        mine, theirs = self._state(trial), self._state(donor)
        # The trial continues from the donor's checkpoint, so its clock restarts at that
        # checkpoint's time. (Ray clones a checkpoint taken at the donor's last
        # perturbation, so it copies that; the donor's newest checkpoint can be later,
        # and the clone would then be "due" again one iteration after it restarts.)
        at = _checkpoint_time(donor, self._time_attr)
        new_config, ops = self._explore_config(
            trial, donor, theirs.last_train_time if at is None else at)
        self._num_perturbations += 1
        # The trial keeps its own (bottom) score until it reports from the donor's state,
        # as in Ray. Taking the donor's score would make a clone waiting to restart look
        # like a top trial, and others would then clone its old checkpoint, over and over.
        mine.last_perturbation_time = theirs.last_perturbation_time if at is None else at
        mine.last_train_time = theirs.last_train_time if at is None else at
        if self._log_config:
            self._perturbations.append({
                "time": theirs.last_train_time, "trial_id": trial.trial_id,
                "donor_trial_id": donor.trial_id, "old_config": dict(trial.config),
                "new_config": new_config, "operations": ops,
                "donor_checkpoint": donor.checkpoint,
            })
            self._write_policy(ctx, trial, donor, new_config)
        return Exploit(config=new_config, checkpoint=donor.checkpoint,
                       donor_trial_id=donor.trial_id)

    def _on_perturbation_step(self, trial: Trial, t: float, score: float | None) -> None:
        """``trial`` reached a perturbation point at ``t`` with ``score`` (op * metric, or
        None when not finite). PBT needs nothing more; PB2 records it for its model."""

    def _explore_config(self, trial: Trial, donor: Trial,
                        resume_time: float) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(new config, operations)`` for ``trial``, which continues from ``donor``'s
        checkpoint at ``resume_time``: the donor's config perturbed or resampled."""
        return explore(donor.config, self._hyperparam_mutations, self._resample_probability,
                       self._perturbation_factors, self._custom_explore_fn, self._rng)

    def _write_policy(self, ctx: SchedulerContext, trial: Trial, donor: Trial,
                      new_config: dict[str, Any]) -> None:
        """Log an exploit to ``pbt_global.txt`` and the trial's ``pbt_policy_<id>.txt``."""
        storage = getattr(ctx, "storage", None)
        if storage is None:  # simulations and contexts without an experiment folder
            return
        # The donor's iteration is where the trial goes on from: its checkpoint's (Ray
        # checkpoints the donor at the result it logs, so there the two are the same).
        donor_iteration = _checkpoint_time(donor, "training_iteration")
        policy = [
            self._state(trial).orig_tag or trial.experiment_tag,
            self._state(donor).orig_tag or donor.experiment_tag,
            trial.last_result.get("training_iteration", 0),
            donor.last_result.get("training_iteration", 0) if donor_iteration is None
            else int(donor_iteration),
            donor.config,
            new_config,
        ]
        line = (json.dumps(policy, default=repr) + "\n").encode()
        mine = storage.path(f"pbt_policy_{trial.trial_id}.txt")
        theirs = storage.path(f"pbt_policy_{donor.trial_id}.txt")
        try:
            glob_path = storage.path("pbt_global.txt")
            old = storage.read_bytes(glob_path) if storage.exists(glob_path) else b""
            storage.write_bytes(glob_path, old + line)
            # The trial now continues the donor's history, so it takes over its policy.
            history = storage.read_bytes(theirs) if storage.exists(theirs) else b""
            storage.write_bytes(mine, history + line)
        except Exception:  # noqa: BLE001 - a log that cannot be written must not stop PBT
            logger.warning("PopulationBasedTraining: could not write the policy log of trial "
                           "%s", trial.trial_id, exc_info=True)

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._trial_state.pop(trial.trial_id, None)

    def choose_trial_to_run(self, tune_controller: SchedulerContext) -> Trial | None:
        """The PENDING/PAUSED trial that trained least; in synch mode only those behind."""
        candidates = [
            t for t in tune_controller.get_trials() if t.status in (PENDING, PAUSED)
            and (not self._synch or self._state(t).last_train_time < self._next_perturbation_sync
                 or self._state(t).pending_exploit is not None)
        ]
        # Least trained first; among equals (an exploited trial takes its donor's time),
        # the one that gave up its slot longest ago, so no trial waits for ever.
        candidates.sort(key=lambda t: (self._state(t).last_train_time,
                                       self._state(t).yielded_at))
        return candidates[0] if candidates else None

    @property
    def perturbations(self) -> list[dict[str, Any]]:
        """Every exploit so far (Ray writes these to ``pbt_policy_*.txt``)."""
        return list(self._perturbations)

    def debug_string(self) -> str:
        return f"PopulationBasedTraining: {self._num_perturbations} perturbs."


def _checkpoint_time(trial: Trial, time_attr: str) -> float | None:
    """``time_attr`` in the result that ``trial``'s newest checkpoint came with."""
    for info in reversed(trial.checkpoints):
        if info.get("path") == trial.checkpoint:
            if time_attr == "training_iteration":
                return float(info["iteration"])
            value = info.get("metrics", {}).get(time_attr)
            return float(value) if value is not None else None
    return None
