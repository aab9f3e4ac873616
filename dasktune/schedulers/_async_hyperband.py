"""Asynchronous successive halving (ASHA): stop trials that fall behind at each rung."""

from __future__ import annotations

import math
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from dasktune.schedulers._base import TrialScheduler, finite, result_value

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]


class _Bracket:
    """Rungs at ``min_t * rf**k`` (highest first), each recording scores of trials that reached it.

    A trial reaching a rung is stopped when its score is below the ``1 - 1/rf`` quantile of
    the scores already recorded there, so about ``1/rf`` of the trials pass each rung.
    """

    def __init__(self, min_t: float, max_t: float, reduction_factor: float, s: int,
                 stop_last_trials: bool):
        self.rf = reduction_factor
        n_rungs = int(math.log(max_t / min_t) / math.log(reduction_factor) + 1)
        self.rungs: list[tuple[float, dict[str, float]]] = [
            (min_t * reduction_factor ** (k + s), {}) for k in reversed(range(n_rungs - s))
        ]
        self.stop_last_trials = stop_last_trials

    def cutoff(self, recorded: dict[str, float]) -> float | None:
        values = [v for v in recorded.values() if finite(v)]
        if not values:
            return None
        return float(np.percentile(values, (1 - 1 / self.rf) * 100))

    def on_result(self, trial_id: str, cur_iter: float, cur_rew: float | None) -> str:
        action = TrialScheduler.CONTINUE
        for milestone, recorded in self.rungs:
            if cur_iter >= milestone and trial_id in recorded and not self.stop_last_trials:
                break  # decided at this rung already
            if cur_iter < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            if cutoff is not None and (cur_rew is None or cur_rew < cutoff):
                action = TrialScheduler.STOP
            if cur_rew is not None:
                recorded[trial_id] = cur_rew
            break
        return action

    def debug_str(self) -> str:
        rungs = ", ".join(f"{m:g}: {len(r)}" for m, r in self.rungs)
        return f"Bracket(rungs {{{rungs}}})"


class AsyncHyperBandScheduler(TrialScheduler):
    """Ray's ``AsyncHyperBandScheduler`` (ASHA): early stopping without pausing.

    Args:
        time_attr: the monotonically increasing result key that measures progress.
        metric: the result key to compare; with ``mode`` it may come from ``TuneConfig``.
        mode: ``"min"`` or ``"max"``.
        max_t: trials stop at this ``time_attr`` value.
        grace_period: no trial is stopped before this ``time_attr`` value (the first rung).
        reduction_factor: each rung keeps about ``1 / reduction_factor`` of its trials.
        brackets: number of brackets, each starting its rungs one factor later.
        stop_last_trials: stop trials at ``max_t`` (else they run on).
    """

    _state_attrs = ("_brackets", "_trial_bracket", "_counter", "_num_stopped")

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ):
        super().__init__(metric, mode)
        name = type(self).__name__
        if not grace_period > 0:
            raise ValueError(f"{name}: grace_period must be positive, got {grace_period!r}")
        if not max_t > 0:
            raise ValueError(f"{name}: max_t must be positive, got {max_t!r}")
        if not max_t >= grace_period:
            raise ValueError(f"{name}: grace_period ({grace_period}) must be <= max_t ({max_t})")
        if not reduction_factor > 1:
            raise ValueError(f"{name}: reduction_factor must be > 1, got {reduction_factor!r}")
        if not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"{name}: brackets must be an int >= 1, got {brackets!r}")
        self._time_attr = time_attr
        self._max_t = max_t
        self._grace_period = grace_period
        self._reduction_factor = reduction_factor
        self._stop_last_trials = stop_last_trials
        self._brackets = [
            _Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials)
            for s in range(brackets)
        ]
        self._trial_bracket: dict[str, int] = {}
        self._counter = 0
        self._num_stopped = 0

    def _bracket_for(self, trial_id: str) -> _Bracket:
        idx = self._trial_bracket.get(trial_id)
        if idx is None:
            # Brackets with more rungs are likelier (Ray's softmax over rung counts); the draw
            # is seeded by the trial id so it is reproducible and needs no RNG state.
            sizes = np.array([len(b.rungs) for b in self._brackets], dtype=float)
            probs = np.exp(sizes - sizes.max())
            probs /= probs.sum()
            u = (zlib.crc32(trial_id.encode()) % 10_000) / 10_000
            idx = int(min(np.searchsorted(np.cumsum(probs), u, side="right"),
                          len(self._brackets) - 1))
            self._trial_bracket[trial_id] = idx
        return self._brackets[idx]

    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._require_metric()
        self._bracket_for(trial.trial_id)

    def _score(self, trial: Trial, result: dict[str, Any]) -> float | None:
        value = result_value(result, self._metric, trial, type(self).__name__)
        return self._metric_op * float(value) if finite(value) else None

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str:
        self._require_metric()
        name = type(self).__name__
        cur = result_value(result, self._time_attr, trial, name)
        score = self._score(trial, result)
        if cur >= self._max_t and self._stop_last_trials:
            action = self.STOP
        else:
            action = self._bracket_for(trial.trial_id).on_result(trial.trial_id, cur, score)
        if action == self.STOP:
            self._num_stopped += 1
        return action

    def on_trial_complete(self, tune_controller: SchedulerContext, trial: Trial,
                          result: dict[str, Any]) -> None:
        if self._metric is None or not result or self._time_attr not in result \
                or self._metric not in result:
            return  # stopped from outside before reporting: nothing to record
        self._bracket_for(trial.trial_id).on_result(
            trial.trial_id, result[self._time_attr], self._score(trial, result))

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        out = f"Using AsyncHyperBand: num_stopped={self._num_stopped}"
        return out + "".join(f"\n  {b.debug_str()}" for b in self._brackets)


ASHAScheduler = AsyncHyperBandScheduler
