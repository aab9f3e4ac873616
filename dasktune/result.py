"""Result keys with Ray Tune's names (``ray.tune.result``)."""

from __future__ import annotations

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

#: Fields filled by dasktune on every result (not the user's metrics).
AUTO_RESULT_KEYS = (
    "training_iteration", "iterations_since_restore", "time_this_iter_s", "time_total_s",
    "time_since_restore", "timestamp", "date", "done", "trial_id", "experiment_tag", "pid",
    "hostname", "node_ip", "worker", "config", "checkpoint_dir_name",
)
