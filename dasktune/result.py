"""Result keys with Ray Tune's names (``ray.tune.result``)."""

from __future__ import annotations

from collections.abc import Iterable

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
#: Return ``{SHOULD_CHECKPOINT: True}`` from ``Trainable.step`` to ask for a checkpoint now.
SHOULD_CHECKPOINT = "should_checkpoint"
#: Set on the result the driver passes to searchers when a scheduler stopped the trial early.
EARLY_STOPPED = "__early_stopped__"

#: Fields filled by dasktune on every result (not the user's metrics).
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
