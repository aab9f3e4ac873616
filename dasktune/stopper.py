"""Stopping rules (``ray.tune.stopper``): when a trial or the whole experiment ends."""

from __future__ import annotations

import datetime
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from typing import Any

from dasktune.session import stop_dict_hit


class Stopper:
    """Base class: ``__call__(trial_id, result)`` stops one trial, ``stop_all()`` all."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        """Whether the whole experiment should stop now."""
        return False


class NoopStopper(Stopper):
    """Never stops anything."""


class FunctionStopper(Stopper):
    """Wraps a callable ``(trial_id, result) -> bool``."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]):
        self._fn = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._fn(trial_id, result))


class DictStopper(Stopper):
    """Ray's ``stop={"training_iteration": 10, "loss": ...}``: any bound reached stops."""

    def __init__(self, criteria: Mapping[str, Any]):
        self.criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return stop_dict_hit(self.criteria, result)


class MaximumIterationStopper(Stopper):
    """Stops each trial after ``max_iter`` iterations."""

    def __init__(self, max_iter: int):
        self._max_iter = max_iter

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return result.get("training_iteration", 0) >= self._max_iter


class TimeoutStopper(Stopper):
    """Stops the whole experiment after ``timeout`` seconds (a number or a ``timedelta``).

    As Ray's: the clock starts at the first ``stop_all()`` check (setup is not counted),
    and the budget is what is left: a stopper saved with the experiment and restored
    goes on with the time it had left, not with the time since the first start.
    """

    def __init__(self, timeout: float | datetime.timedelta):
        if isinstance(timeout, datetime.timedelta):
            seconds = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            seconds = float(timeout)
        else:
            raise ValueError("`timeout` parameter has to be either a number or a "
                             f"`datetime.timedelta` object. Found: {type(timeout)}")
        self._timeout = seconds
        self._budget = seconds
        self._last_check: float | None = None

    def stop_all(self) -> bool:
        now = time.monotonic()
        if self._last_check is not None:
            self._budget -= now - self._last_check
        self._last_check = now
        return self._budget <= 0

    def __getstate__(self) -> dict[str, Any]:
        # A monotonic reading means nothing in another process: the budget travels alone.
        return dict(self.__dict__, _last_check=None)


class TrialPlateauStopper(Stopper):
    """Stops a trial whose metric's std over the last ``num_results`` is below ``std``."""

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4,
                 grace_period: int = 4, metric_threshold: float | None = None,
                 mode: str | None = None):
        self._metric, self._std, self._n = metric, std, num_results
        self._grace, self._threshold, self._mode = grace_period, metric_threshold, mode
        self._iter: dict[str, int] = defaultdict(int)
        self._window: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=num_results))

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self._metric)
        if value is None:
            return False
        self._iter[trial_id] += 1
        window = self._window[trial_id]
        window.append(float(value))
        if self._threshold is not None and self._mode:
            if self._mode == "min" and value > self._threshold:
                return False
            if self._mode == "max" and value < self._threshold:
                return False
        if self._iter[trial_id] < self._grace or len(window) < self._n:
            return False
        mean = sum(window) / len(window)
        std = (sum((v - mean) ** 2 for v in window) / len(window)) ** 0.5
        return std < self._std


class CombinedStopper(Stopper):
    """Stops when any of its stoppers does."""

    def __init__(self, *stoppers: Stopper):
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any(s(trial_id, result) for s in self._stoppers)

    def stop_all(self) -> bool:
        """Whether the whole experiment should stop now."""
        return any(s.stop_all() for s in self._stoppers)


def make_stopper(stop: Any) -> tuple[Stopper, dict[str, Any] | None]:
    """Normalise ``RunConfig.stop`` into a Stopper, plus the plain dict (if any) that
    trial actors apply themselves so a trial stops exactly at the bound."""
    if stop is None:
        return NoopStopper(), None
    if isinstance(stop, Stopper):
        return stop, None
    if isinstance(stop, Mapping):
        for key, bound in stop.items():
            if not isinstance(key, str):
                raise TypeError(f"stop: keys must be metric names, got {key!r}")
            # A bool counts, as in Ray: its examples stop on {"done": True}.
            if not isinstance(bound, (int, float)):
                raise TypeError(f"stop[{key!r}] must be a number, got {bound!r}")
        return DictStopper(stop), dict(stop)
    if callable(stop):
        return FunctionStopper(stop), None
    raise TypeError(
        f"stop must be a dict, a callable (trial_id, result) -> bool or a Stopper, got {stop!r}"
    )
