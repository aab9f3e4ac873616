"""The messages the driver sends to the dashboard, built from :class:`~dasktune.trial.Trial`.

Three kinds travel in batches to the dashboard plugin's scheduler handler, or under the
``"dasktune"`` event topic where no plugin listens (plain JSON/msgpack types only):

``{"type": "experiment", "experiment_id", "name", "storage", "searcher", "scheduler",
"metric", "mode", "start_time", "end_time", "status", "waiting"}``
    The experiment's summary; sent first and whenever it changes. ``waiting`` is the
    driver's note while trials wait (``"waiting for resources: <reason>"``), else None.
``{"type": "trials", "experiment_id", "trials": [record, ...]}``
    Full records of the trials that changed (see :func:`trial_record`).
``{"type": "results", "experiment_id", "points": [[trial_id, training_iteration, value, t]]}``
    New values of the experiment's metric, in report order.

The same builders serve the live callback and the reader of a finished experiment, so
both pages show the same thing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dasktune.dashboard._redact import finite_number, jsonable, strip_uri
from dasktune.metric_mode import check_mode

if TYPE_CHECKING:
    from dasktune.trial import Trial

TOPIC = "dasktune"
EXPERIMENT = "experiment"
TRIALS = "trials"
RESULTS = "results"

RUNNING = "RUNNING"
FINISHED = "FINISHED"


def check_metric_mode(metric: Any, mode: Any) -> None:
    """Raise a clear error for a metric that is not a string or a mode not min/max."""
    if metric is not None and not isinstance(metric, str):
        raise TypeError(f"experiment metric must be a str or None, got {type(metric).__name__}")
    check_mode(mode, "experiment")


def better(a: float, b: float | None, mode: str | None) -> bool:
    """Whether value ``a`` beats ``b`` (None: nothing yet) under ``mode``."""
    if b is None:
        return True
    return a > b if mode == "max" else a < b


def describe(obj: Any) -> str | None:
    """A short, secret-free name for a searcher or scheduler (object, class or string)."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return strip_uri(obj)
    if isinstance(obj, dict):
        for key in ("type", "name", "class"):
            if isinstance(obj.get(key), str):
                return strip_uri(obj[key])
        return None
    if isinstance(obj, type):
        return obj.__name__
    return type(obj).__name__


def experiment_message(experiment_id: str, info: dict[str, Any], *, status: str,
                       end_time: float | None = None,
                       waiting: str | None = None) -> dict[str, Any]:
    """The ``experiment`` message for ``info`` (name, storage, searcher, ...);
    ``waiting`` says why the experiment waits, if it does."""
    return {
        "type": EXPERIMENT,
        "experiment_id": str(experiment_id),
        "name": str(info.get("name") or experiment_id),
        "storage": strip_uri(info.get("storage")),
        "searcher": describe(info.get("searcher")),
        "scheduler": describe(info.get("scheduler")),
        "metric": info.get("metric"),
        "mode": info.get("mode"),
        "start_time": finite_number(info.get("start_time")),
        "end_time": finite_number(end_time if end_time is not None else info.get("end_time")),
        "status": status,
        "waiting": str(waiting) if waiting else None,
    }


def trial_record(trial: Trial, metric: str | None, mode: str | None) -> dict[str, Any]:
    """The dashboard's view of one trial: no secrets, JSON types only."""
    last_result = trial.last_result or {}
    last = best = None
    if metric is not None:
        last = finite_number(last_result.get(metric))
        stats = trial.metric_analysis.get(metric) or {}
        best = finite_number(stats.get("max" if mode == "max" else "min"))
    placements = [
        {
            "attempt": p.attempt,
            "worker": str(p.worker),
            "host": str(p.host),
            "start": finite_number(p.start),
            "end": finite_number(p.end),
            "outcome": p.outcome,
            # The workers of the attempt's gang (several workers for one trial), rank order.
            "gang": [str(w) for w in p.gang],
            "gang_start": finite_number(p.gang_start),
        }
        for p in trial.placements
    ]
    current = placements[-1] if placements else {}
    iteration = last_result.get("training_iteration")
    return {
        "trial_id": str(trial.trial_id),
        "status": trial.status,
        "config": jsonable(trial.config),
        "iteration": iteration if isinstance(iteration, int) else None,
        "last": last,
        "best": best,
        "worker": current.get("worker"),
        "host": current.get("host"),
        "gang_workers": len(current.get("gang") or []),
        "restarts": int(trial.num_restarts),
        "failures": int(trial.num_failures),
        "stop_reason": trial.stop_reason,
        "start_time": finite_number(trial.start_time),
        "end_time": finite_number(trial.end_time),
        "placements": placements,
    }


def result_point(trial_id: str, result: dict[str, Any], metric: str | None,
                 t: float) -> list[Any] | None:
    """``[trial_id, training_iteration, value, t]`` for a result, or ``None`` if it has none."""
    if metric is None:
        return None
    value = finite_number(result.get(metric))
    iteration = result.get("training_iteration")
    if value is None or isinstance(iteration, bool) or not isinstance(iteration, int):
        return None
    return [str(trial_id), iteration, value, float(t)]
