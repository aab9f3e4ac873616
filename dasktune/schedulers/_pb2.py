"""PB2 (Population Based Bandits): PBT whose explore step is a GP bandit within bounds."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from numbers import Real
from typing import TYPE_CHECKING, Any

from dasktune.schedulers._pbt import PopulationBasedTraining

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["PB2"]

_MAX_RECORDS = 2000  # observations kept (the GP itself uses the newest few hundred)


def flatten_bounds(bounds: Mapping[str, Any], prefix: tuple[str, ...] = ()
                   ) -> dict[tuple[str, ...], tuple[float, float]]:
    """``{"opt": {"lr": [0, 1]}}`` -> ``{("opt", "lr"): (0.0, 1.0)}``, or a ValueError
    naming the key whose bounds are not ``[low, high]`` numbers with ``low <= high``."""
    out: dict[tuple[str, ...], tuple[float, float]] = {}
    for key, value in bounds.items():
        path = (*prefix, str(key))
        name = "/".join(path)
        if isinstance(value, Mapping):
            if not value:
                raise ValueError(f"PB2: hyperparam_bounds[{name!r}] is an empty dict")
            out.update(flatten_bounds(value, path))
            continue
        if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
                isinstance(v, Real) and not isinstance(v, bool) for v in value):
            raise ValueError(f"PB2: hyperparam_bounds values must be [low, high] lists or "
                             f"tuples of two numbers, got {value!r} for {name!r}")
        low, high = float(value[0]), float(value[1])
        if low > high:
            raise ValueError(f"PB2: hyperparam_bounds[{name!r}] must be [low, high] with "
                             f"low <= high, got {value!r}")
        out[path] = (low, high)
    return out


def _get(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        config = config[key]
    return config


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


def _has(config: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(config, Mapping) or key not in config:
            return False
        config = config[key]
    return True


class PB2(PopulationBasedTraining):
    """Ray's ``PB2`` (``ray.tune.schedulers.pb2.PB2``): Population Based Bandits.

    Exploitation is PBT's: every ``perturbation_interval`` of ``time_attr`` a trial in the
    bottom ``quantile_fraction`` restarts from the checkpoint of one in the top. Exploration
    differs: instead of perturbing the donor's values at random, PB2 fits a time-varying
    Gaussian process to how fast each trial's score rose over each interval, given its time,
    score and hyperparameters, and picks the values within ``hyperparam_bounds`` that
    maximise the upper confidence bound from the clone's starting point (see
    :mod:`dasktune.schedulers._pb2_gp`). Until some trial has two perturbation points (no
    rate observed yet) the clone keeps its donor's values, as in Ray.

    ``hyperparam_bounds``: ``{"lr": [1e-4, 1e-1]}``, nested dicts for nested configs. A
    hyperparameter missing from a trial's config is drawn uniformly within its bounds when
    the trial is added. New values keep the donor's type (an int stays an int, rounded).
    ``custom_explore_fn`` is applied to each new config. ``log_config`` writes Ray's
    ``pbt_global.txt`` / ``pbt_policy_<trial_id>.txt`` (replayable with
    :class:`~dasktune.schedulers.pbt.PopulationBasedTrainingReplay`). ``seed`` (dasktune
    only) makes donor choice, filled values and the GP's optimiser reproducible.

    Differences from Ray: the bonus is ``kappa * std`` (GP-UCB; Ray's adds the variance),
    the GP also fits an observation-noise term, and a fit uses the newest 250 intervals
    (Ray picks a window of 200 or more by cross-validation).

    Needs scikit-learn: ``pip install "dasktune[pb2]"``.
    """

    _state_attrs = PopulationBasedTraining._state_attrs + (
        "_records", "_pending", "_last_exploration_time")

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        hyperparam_bounds: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        custom_explore_fn: Callable[[dict], dict] | None = None,
        *,
        seed: int | None = None,
    ):
        try:
            from dasktune.schedulers._pb2_gp import propose
        except ImportError as exc:
            raise ImportError(f'PB2 needs scikit-learn and scipy ({exc}): pip install '
                              f'"dasktune[pb2]"') from exc
        if not hyperparam_bounds:
            raise ValueError("PB2: hyperparam_bounds must be given, e.g. "
                             "{'lr': [0.0001, 0.1]}")
        if not isinstance(hyperparam_bounds, Mapping):
            raise TypeError(f"PB2: hyperparam_bounds must be a dict, got "
                            f"{type(hyperparam_bounds).__name__}")
        self._bounds = flatten_bounds(hyperparam_bounds)
        super().__init__(
            time_attr=time_attr, metric=metric, mode=mode,
            perturbation_interval=perturbation_interval,
            hyperparam_mutations=hyperparam_bounds, quantile_fraction=quantile_fraction,
            resample_probability=0.0, custom_explore_fn=custom_explore_fn,
            log_config=log_config, require_attrs=require_attrs, synch=synch, seed=seed)
        self._propose = propose
        # [trial_id, time, [values in bounds order], score]: one per perturbation point,
        # plus one per exploit (the clone's new values at its donor's time and score).
        self._records: list[list[Any]] = []
        # Scaled values chosen since the newest perturbation time last moved: this round.
        self._pending: list[list[float]] = []
        self._last_exploration_time = float("-inf")

    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        filled: dict[str, float] = {}
        for path, (low, high) in self._bounds.items():
            if not _has(trial.config, path):
                value = self._rng.uniform(low, high)
                _set(trial.config, path, value)
                filled["/".join(path)] = value
        trial.evaluated_params.update(filled)  # shown as the trial's parameters
        super().on_trial_add(tune_controller, trial)

    def _values(self, config: Mapping[str, Any]) -> list[float]:
        return [float(_get(config, path)) for path in self._bounds]

    def _on_perturbation_step(self, trial: Trial, t: float, score: float | None) -> None:
        if score is None:
            return
        self._records.append([trial.trial_id, float(t), self._values(trial.config), score])
        del self._records[:-_MAX_RECORDS]

    def _intervals(self) -> tuple[list[list[float]], list[float]]:
        """Rows ``[time, score before, scaled values...]`` and the score's rate of change,
        from each trial's consecutive records with the same values."""
        last: dict[str, list[Any]] = {}
        rows, rates = [], []
        for rec in self._records:
            tid, t, values, score = rec
            prev = last.get(tid)
            last[tid] = rec
            if prev is None or prev[2] != values or t <= prev[1]:
                continue
            rows.append([t, prev[3], *self._scaled(values)])
            rates.append((score - prev[3]) / (t - prev[1]))
        return rows, rates

    def _scaled(self, values: list[float]) -> list[float]:
        return [(v - lo) / (hi - lo) if hi > lo else 0.0
                for v, (lo, hi) in zip(values, self._bounds.values())]

    def _explore_config(self, trial: Trial, donor: Trial,
                        resume_time: float) -> tuple[dict[str, Any], dict[str, Any]]:
        new = copy.deepcopy(dict(donor.config))
        rows, rates = self._intervals()
        mine = [r for r in self._records if r[0] == donor.trial_id]
        if rows and mine:
            newest = max(r[1] for r in self._records)
            if newest > self._last_exploration_time:  # a new round: nothing pending
                self._pending, self._last_exploration_time = [], newest
            start = (mine[-1][1], mine[-1][3])  # the clone goes on from the donor's state
            scaled = self._propose(rows, rates, start, self._pending or None,
                                   self._rng.randrange(2**32))
            self._pending.append([float(x) for x in scaled])
            for (path, (lo, hi)), x in zip(self._bounds.items(), scaled):
                value = min(max(lo + float(x) * (hi - lo), lo), hi)
                old = _get(donor.config, path)
                if isinstance(old, int) and not isinstance(old, bool):
                    value = min(max(round(value), math.ceil(lo)), math.floor(hi))
                _set(new, path, value)
            # Its next record's change is measured from the donor's score.
            self._records.append([trial.trial_id, start[0], self._values(new), start[1]])
        if self._custom_explore_fn is not None:
            out = self._custom_explore_fn(new)
            if not isinstance(out, dict):
                raise TypeError(f"custom_explore_fn must return the new config dict, got "
                                f"{out!r}")
            new = out
        return new, {}

    def debug_string(self) -> str:
        return f"PB2: {self._num_perturbations} perturbs."
