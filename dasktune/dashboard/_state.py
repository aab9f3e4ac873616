"""What the dashboard knows: a bounded store of experiments fed by messages.

:class:`DashboardState` is pure data (no Bokeh, no Dask). The scheduler plugin feeds it
live messages; the static server feeds it messages rebuilt from storage. Pages and JSON
handlers only read it. Memory stays bounded: at most ``max_points`` points per trial
(older points are thinned by half when the cap is hit), ``max_experiment_points`` points
in all of an experiment's curves (when that cap is hit, the curves longer than their
share are thinned by half, so 10,000 trials of 100 reports keep a coarser curve each
rather than a million points), and ``max_experiments`` experiments (the oldest finished
ones are dropped first).

All methods take a lock, so readers on another thread see consistent snapshots.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dasktune.dashboard._messages import (
    EXPERIMENT,
    FINISHED,
    RESULTS,
    TRIALS,
    better,
)

# A TERMINATED trial with another stop_reason was stopped by the driver (its
# "early_stopped": the scheduler said STOP), not ended by its trainable.
NATURAL_STOPS = frozenset({None, "", "done", "completed", "finished"})

_INFO_KEYS = ("name", "storage", "searcher", "scheduler", "metric", "mode", "start_time",
              "end_time", "status", "waiting")


@dataclass
class ExperimentView:
    """Everything known about one experiment; ``version`` grows on every change."""

    experiment_id: str
    info: dict[str, Any] = field(default_factory=dict)
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)
    points: dict[str, list[list[float]]] = field(default_factory=dict)  # [iteration, value, t]
    best_so_far: list[list[Any]] = field(default_factory=list)  # [t, value, trial_id]
    n_points: int = 0  # in all of ``points``
    thin_at: int = 0  # n_points that makes every curve thinned by half (0: the default)
    version: int = 0
    received: float = field(default_factory=time.time)

    @property
    def mode(self) -> str | None:
        return self.info.get("mode")

    def better(self, a: float, b: float | None) -> bool:
        """Whether value ``a`` beats ``b`` under the experiment's mode."""
        return better(a, b, self.mode)

    def best_trial_id(self) -> str | None:
        """The trial with the best ``best`` value, if the experiment has a mode."""
        if self.mode is None:
            return None
        best_id, best = None, None
        for trial_id, record in self.trials.items():
            value = record.get("best")
            if value is not None and self.better(value, best):
                best_id, best = trial_id, value
        return best_id

    def early_stops(self) -> dict[str, str]:
        """Trial id -> "stopped early at rung R (of M iterations)" for the trials the
        scheduler stopped short of M, the furthest iteration any trial of the experiment
        reached. The rung is the scheduler's ``time_attr`` value at its decision; with
        another ``time_attr`` than ``training_iteration``: "stopped early at rung
        time_total_s 12.5 (iteration N of M)"; a record without one: "stopped early at
        iteration N of M".

        ASHA also says STOP to the trials that reach its ``max_t``, a bound the records
        do not carry; its survivors reach it, so "stopped below the furthest iteration"
        tells the pruned trials from the finished ones.
        """
        iterations = {tid: r.get("iteration") if isinstance(r.get("iteration"), int) else 0
                      for tid, r in self.trials.items()}
        furthest = max(iterations.values(), default=0)
        out = {}
        for tid in self._stopped_early(iterations, furthest):
            rung = rung_of(self.trials[tid])
            where = f"iteration {iterations[tid]} of {furthest}"
            if rung is not None and rung[0] == "training_iteration":
                where = f"rung {rung[1]:g} (of {furthest} iterations)"
            elif rung is not None:
                where = f"rung {rung[0]} {rung[1]:g} ({where})"
            out[tid] = f"stopped early at {where}" if iterations[tid] \
                else "stopped before its first result"
        return out

    def _stopped_early(self, iterations: dict[str, int], furthest: int) -> list[str]:
        return [tid for tid, r in self.trials.items()
                if r.get("status") == "TERMINATED" and r.get("stop_reason") not in NATURAL_STOPS
                and iterations[tid] < furthest]

    def early_stops_by_rung(self) -> list[dict[str, Any]]:
        """How many trials the scheduler stopped early at each rung, lowest rung first:
        ``[{"time_attr": ..., "rung": ..., "trials": n}]`` (the summary's
        ``stopped_early_by_rung``)."""
        counts: Counter[tuple[str, float]] = Counter()
        for tid in self.early_stops():
            rung = rung_of(self.trials[tid])
            if rung is not None:
                counts[rung] += 1
        return [{"time_attr": attr, "rung": value, "trials": n}
                for (attr, value), n in sorted(counts.items(), key=lambda kv: kv[0][1])]

    def summary(self) -> dict[str, Any]:
        by_status = Counter(r.get("status") for r in self.trials.values())
        start, end = self.info.get("start_time"), self.info.get("end_time")
        elapsed = None
        if start is not None:
            elapsed = max(0.0, (end if end is not None else time.time()) - start)
        best_id = self.best_trial_id()
        info = {k: self.info.get(k) for k in _INFO_KEYS}
        if info["status"] == FINISHED:
            info["waiting"] = None  # a driver that died mid-wait sent no update
        return {
            "experiment_id": self.experiment_id,
            **info,
            "num_trials": len(self.trials),
            "trials_by_status": dict(sorted(by_status.items())),
            "elapsed_s": elapsed,
            "best_trial_id": best_id,
            "best_value": self.trials[best_id]["best"] if best_id else None,
            "stopped_early_by_rung": self.early_stops_by_rung(),
        }


class DashboardState:
    """The experiments one dashboard shows, updated by :meth:`apply`."""

    def __init__(self, *, max_points: int = 2000, max_experiments: int = 50,
                 max_experiment_points: int = 200_000):
        if max_points < 4:
            raise ValueError(f"max_points must be at least 4, got {max_points!r}")
        if max_experiments < 1:
            raise ValueError(f"max_experiments must be at least 1, got {max_experiments!r}")
        if max_experiment_points < max_points:
            raise ValueError(f"max_experiment_points must be at least max_points "
                             f"({max_points}), got {max_experiment_points!r}")
        self.max_points = int(max_points)
        self.max_experiment_points = int(max_experiment_points)
        self.max_experiments = int(max_experiments)
        self._experiments: dict[str, ExperimentView] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ writes
    def apply(self, msg: Any) -> None:
        """Take one message (see :mod:`dasktune.dashboard._messages`); bad ones raise ValueError."""
        if not isinstance(msg, dict):
            raise ValueError(f"dasktune dashboard message must be a dict, got {type(msg).__name__}")
        kind, experiment_id = msg.get("type"), msg.get("experiment_id")
        if not isinstance(experiment_id, str) or not experiment_id:
            raise ValueError(f"dasktune dashboard message without experiment_id: {kind!r}")
        with self._lock:
            view = self._view(experiment_id)
            if kind == EXPERIMENT:
                view.info.update({k: msg.get(k) for k in _INFO_KEYS if k in msg})
            elif kind == TRIALS:
                self._apply_trials(view, msg.get("trials"))
            elif kind == RESULTS:
                self._apply_points(view, msg.get("points"))
            else:
                raise ValueError(f"unknown dasktune dashboard message type {kind!r}")
            view.version += 1

    def _view(self, experiment_id: str) -> ExperimentView:
        view = self._experiments.get(experiment_id)
        if view is None:
            view = self._experiments[experiment_id] = ExperimentView(experiment_id)
            self._evict()
        return view

    def _evict(self) -> None:
        while len(self._experiments) > self.max_experiments:
            finished = [v for v in self._experiments.values()
                        if v.info.get("status") == FINISHED]
            victim = min(finished or self._experiments.values(), key=lambda v: v.received)
            del self._experiments[victim.experiment_id]

    @staticmethod
    def _apply_trials(view: ExperimentView, trials: Any) -> None:
        if not isinstance(trials, (list, tuple)):  # msgpack hands lists over as tuples
            raise ValueError("dasktune 'trials' message needs a list under 'trials'")
        for record in trials:
            if not isinstance(record, dict) or not isinstance(record.get("trial_id"), str):
                raise ValueError(f"dasktune trial record without a trial_id: {record!r:.100}")
            view.trials[record["trial_id"]] = record

    def _apply_points(self, view: ExperimentView, points: Any) -> None:
        if not isinstance(points, (list, tuple)):
            raise ValueError("dasktune 'results' message needs a list under 'points'")
        best = view.best_so_far[-1][1] if view.best_so_far else None
        for point in points:
            if not (isinstance(point, (list, tuple)) and len(point) == 4):
                raise ValueError(f"dasktune result point must be [trial, iter, value, t]: "
                                 f"{point!r:.100}")
            trial_id, iteration, value, t = point
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                       for x in (iteration, value, t)):
                raise ValueError(f"dasktune result point needs numbers: {point!r:.100}")
            series = view.points.setdefault(str(trial_id), [])
            # A trial restored from a checkpoint reports its iterations again: the curve
            # follows the attempt that counts, so drop the tail it replaces.
            while series and series[-1][0] >= iteration:
                series.pop()
                view.n_points -= 1
            series.append([iteration, value, t])
            view.n_points += 1
            if len(series) > self.max_points:
                view.n_points -= len(series)
                series[:] = _halved(series)
                view.n_points += len(series)
            if view.n_points > (view.thin_at or self.max_experiment_points):
                self._thin_experiment(view)
            if view.mode is not None and view.better(value, best):
                best = value
                view.best_so_far.append([t, value, str(trial_id)])
                if len(view.best_so_far) > self.max_points:
                    view.best_so_far[:] = _halved(view.best_so_far)

    def _thin_experiment(self, view: ExperimentView) -> None:
        """Halve the curves longer than their share of half the experiment's cap, so
        long curves give way first and a trial's old curve is not thinned again and
        again while new trials come."""
        share = max(2, self.max_experiment_points // (2 * len(view.points)))
        for curve in view.points.values():
            while len(curve) > share:
                curve[:] = _halved(curve)
        view.n_points = sum(map(len, view.points.values()))
        # A curve keeps its first and newest points: with more trials than the cap has
        # room for, the next thinning waits until the count doubles (not every point).
        view.thin_at = max(self.max_experiment_points, 2 * view.n_points)

    # ------------------------------------------------------------------- reads
    def experiment_ids(self) -> list[str]:
        """Ids, newest first (by start time, else by arrival)."""
        with self._lock:
            views = list(self._experiments.values())
        views.sort(key=lambda v: v.info.get("start_time") or v.received, reverse=True)
        return [v.experiment_id for v in views]

    def version(self, experiment_id: str | None) -> int:
        """A counter that grows whenever the experiment's view changes (-1 for an unknown one)."""
        with self._lock:
            view = self._experiments.get(experiment_id) if experiment_id else None
            return -1 if view is None else view.version

    def snapshot(self, experiment_id: str) -> ExperimentView | None:
        """A deep copy of one experiment, safe to read without the lock."""
        with self._lock:
            view = self._experiments.get(experiment_id)
            return None if view is None else copy.deepcopy(view)

    def experiments(self) -> list[dict[str, Any]]:
        """Summaries of every experiment, newest first (the ``/api/experiments`` payload)."""
        with self._lock:
            return [self._experiments[i].summary() for i in self.experiment_ids()]

    def trials(self, experiment_id: str, *, points: bool = False) -> list[dict[str, Any]]:
        """Trial records of one experiment, each with ``stopped_early`` and its
        ``status_detail`` (see :meth:`ExperimentView.early_stops`); with ``points``, each
        gets its metric curve."""
        with self._lock:
            view = self._experiments.get(experiment_id)
            if view is None:
                raise KeyError(experiment_id)
            records = copy.deepcopy(list(view.trials.values()))
            early = view.early_stops()
            for record in records:
                record["stopped_early"] = record["trial_id"] in early
                record["status_detail"] = early.get(record["trial_id"])
            if points:
                for record in records:
                    record["points"] = copy.deepcopy(view.points.get(record["trial_id"], []))
            return records


def rung_of(record: dict[str, Any]) -> tuple[str, float] | None:
    """``(time_attr, value)`` where a trial record says its scheduler stopped it, or None."""
    rung = record.get("stop_rung")
    if not isinstance(rung, dict):
        return None
    attr, value = rung.get("time_attr"), rung.get("value")
    if not isinstance(attr, str) or isinstance(value, bool) or \
            not isinstance(value, (int, float)):
        return None
    return attr, value


def _halved(series: list[Any]) -> list[Any]:
    """Every other point of ``series``, and always its newest."""
    return series[:-1:2] + series[-1:]
