"""Result keys with Ray Tune's names (``ray.tune.result``), and the one function that
fills Ray's automatic fields into a result (the session, a standalone ``Trainable.train``
and the simulator all call it)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

TRAINING_ITERATION = "training_iteration"
TIME_THIS_ITER_S = "time_this_iter_s"
TIME_TOTAL_S = "time_total_s"
TIMESTAMP = "timestamp"
DONE = "done"
TRIAL_ID = "trial_id"
EPISODES_TOTAL = "episodes_total"
TIMESTEPS_TOTAL = "timesteps_total"
MEAN_ACCURACY = "mean_accuracy"
MEAN_LOSS = "mean_loss"
NODE_IP = "node_ip"
PID = "pid"
HOSTNAME = "hostname"
#: The metric a number returned (or yielded) by a function trainable is reported as.
DEFAULT_METRIC = "_metric"
#: Return ``{SHOULD_CHECKPOINT: True}`` from ``Trainable.step`` to ask for a checkpoint now.
SHOULD_CHECKPOINT = "should_checkpoint"
#: Set on the result the driver passes to searchers when a scheduler stopped the trial early.
EARLY_STOPPED = "__early_stopped__"

#: Fields filled by dasktune on every result (not the user's metrics): those
#: :func:`fill_auto_fields` sets, and the checkpoint's folder name.
AUTO_RESULT_KEYS = (
    "training_iteration", "iterations_since_restore", "time_this_iter_s", "time_total_s",
    "time_since_restore", "timestamp", "date", "done", "trial_id", "experiment_tag", "pid",
    "hostname", "node_ip", "worker", "config", "checkpoint_dir_name",
)


def reported_keys(keys: Iterable[str]) -> str:
    """``reported keys: [the trainable's own], and the automatic ...``: for messages about a
    missing key, the user's own keys first rather than behind a dozen automatic ones."""
    keys = set(keys) - {"config"}
    text = f"reported keys: {sorted(k for k in keys if k not in AUTO_RESULT_KEYS)}"
    auto = sorted(k for k in keys if k in AUTO_RESULT_KEYS)
    return f"{text}, and the automatic {', '.join(auto)}" if auto else text


def format_date(timestamp: float, *, utc: bool = False) -> str:
    """Ray's ``date`` (and experiment-name) format: local time to the second,
    ``2026-12-06_10-15-44``; UTC with ``utc``."""
    tz = datetime.timezone.utc if utc else None
    return datetime.datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d_%H-%M-%S")


def fill_auto_fields(metrics: dict[str, Any], *, training_iteration: int,
                     iterations_since_restore: int, time_this_iter_s: float,
                     time_total_s: float, time_since_restore: float, timestamp: float,
                     trial_id: str | None, pid: int, hostname: str, node_ip: str,
                     config: dict[str, Any], date: str | None = None,
                     experiment_tag: str | None = None,
                     worker: str | None = None) -> dict[str, Any]:
    """A copy of ``metrics`` with Ray's automatic fields filled in.

    ``done`` defaults to False; a ``time_this_iter_s`` the trainable reported itself is
    kept (Ray believes a step that times itself). ``date`` defaults to
    :func:`format_date` of ``timestamp``; ``experiment_tag`` and ``worker`` are set when
    given (a standalone ``Trainable.train()`` has neither).
    """
    result = dict(metrics)
    result.setdefault(DONE, False)
    result[TRAINING_ITERATION] = training_iteration
    result["iterations_since_restore"] = iterations_since_restore
    result[TIME_THIS_ITER_S] = result.get(TIME_THIS_ITER_S, time_this_iter_s)
    result[TIME_TOTAL_S] = time_total_s
    result["time_since_restore"] = time_since_restore
    result[TIMESTAMP] = int(timestamp)
    result["date"] = format_date(timestamp) if date is None else date
    result[TRIAL_ID] = trial_id
    if experiment_tag is not None:
        result["experiment_tag"] = experiment_tag
    result[PID] = pid
    result[HOSTNAME] = hostname
    result[NODE_IP] = node_ip
    if worker is not None:
        result["worker"] = worker
    result["config"] = config
    return result
