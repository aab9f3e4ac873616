"""Median stopping: stop a trial whose best result is worse than the median of running means."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dasktune.schedulers._base import TrialScheduler, finite, result_value
from dasktune.trial import PAUSED, PENDING

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["MedianStoppingRule"]


class MedianStoppingRule(TrialScheduler):
    """Ray's ``MedianStoppingRule`` (the Google Vizier rule).

    At time ``t`` past the grace period, a trial is stopped when its best result so far is
    worse than the median, over other trials that reached ``t``, of their mean result between
    the grace period and ``t``.

    Args:
        time_attr: the monotonically increasing result key that measures progress.
        metric: the result key to compare; with ``mode`` it may come from ``TuneConfig``.
        mode: ``"min"`` or ``"max"``.
        grace_period: no trial is stopped before this ``time_attr`` value.
        min_samples_required: trials that reached ``t`` needed to compute a median.
        min_time_slice: with too few samples, pause a trial to let queued ones run, at most
            once per this much ``time_attr``.
        hard_stop: stop a losing trial; if False, pause it and resume it only when nothing
            else waits.
    """

    _state_attrs = ("_results", "_stopped", "_last_pause", "_num_stopped")

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
    ):
        super().__init__(metric, mode)
        name = type(self).__name__
        if grace_period < 0:
            raise ValueError(f"{name}: grace_period must be >= 0, got {grace_period!r}")
        if not isinstance(min_samples_required, int) or min_samples_required < 1:
            raise ValueError(
                f"{name}: min_samples_required must be an int >= 1, got {min_samples_required!r}")
        self._time_attr = time_attr
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        self._results: dict[str, list[tuple[float, float]]] = {}  # id -> (time, op * metric)
        self._stopped: set[str] = set()
        self._last_pause: dict[str, float] = {}
        self._num_stopped = 0

    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._require_metric()
        self._results.setdefault(trial.trial_id, [])
        self._last_pause.setdefault(trial.trial_id, -math.inf)

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str:
        self._require_metric()
        name = type(self).__name__
        tid = trial.trial_id
        t = float(result_value(result, self._time_attr, trial, name))
        value = result_value(result, self._metric, trial, name)
        if tid in self._stopped:
            return self.CONTINUE  # soft-stopped and resumed: it runs on as FIFO
        if finite(value):
            self._results.setdefault(tid, []).append((t, self._metric_op * float(value)))
        if t < self._grace_period:
            return self.CONTINUE
        others = [o for o in self._beyond(t) if o != tid]
        if len(others) < self._min_samples_required:
            return self._on_insufficient_samples(tune_controller, trial, t)
        median = float(np.median([self._running_mean(o, t) for o in others]))
        best = self._best(tid)
        if best is None or best < median:
            self._num_stopped += 1
            if self._hard_stop:
                return self.STOP
            self._stopped.add(tid)
            return self.PAUSE
        return self.CONTINUE

    def _on_insufficient_samples(self, ctx: SchedulerContext, trial: Trial, t: float) -> str:
        waiting = any(o.status in (PENDING, PAUSED) for o in ctx.get_live_trials()
                      if o.trial_id != trial.trial_id)
        if waiting and t - self._last_pause.get(trial.trial_id, -math.inf) > self._min_time_slice:
            self._last_pause[trial.trial_id] = t
            return self.PAUSE
        return self.CONTINUE

    def _beyond(self, t: float) -> list[str]:
        return [tid for tid, rs in self._results.items() if rs and rs[-1][0] >= t]

    def _running_mean(self, tid: str, t: float) -> float:
        scoped = [v for (rt, v) in self._results[tid] if self._grace_period <= rt <= t]
        return float(np.mean(scoped)) if scoped else -math.inf

    def _best(self, tid: str) -> float | None:
        values = [v for _, v in self._results.get(tid, [])]
        return max(values) if values else None

    def on_trial_complete(self, tune_controller: SchedulerContext, trial: Trial,
                          result: dict[str, Any]) -> None:
        pass  # its results stay: completed trials count towards later medians

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._results.pop(trial.trial_id, None)

    def choose_trial_to_run(self, tune_controller: SchedulerContext) -> Trial | None:
        """PENDING first, then PAUSED trials that were not soft-stopped, then soft-stopped ones."""
        trials = tune_controller.get_trials()
        for trial in trials:
            if trial.status == PENDING:
                return trial
        paused = [t for t in trials if t.status == PAUSED]
        for trial in paused:
            if trial.trial_id not in self._stopped:
                return trial
        return paused[0] if paused else None

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={self._num_stopped}."
