"""Callback-driven checkpoints (Ray's ``SHOULD_CHECKPOINT`` set by a ``tune.Callback``).

A Callback sees a result in the driver and sets ``result[SHOULD_CHECKPOINT] = True``;
the trial's class Trainable then saves after its step in flight, as Ray schedules a
save on the actor. A function trainable cannot be checkpointed on demand: ignored.
"""

from __future__ import annotations

import json
import os
import time

import dasktune as tune
from dasktune.result import SHOULD_CHECKPOINT


class Stepper(tune.Trainable):
    def setup(self, config):
        self.n = 0

    def step(self):
        time.sleep(0.05)  # a step that takes a moment, as real training does
        self.n += 1
        return {"n": self.n}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "n.json"), "w") as f:
            json.dump({"n": self.n}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "n.json")) as f:
            self.n = json.load(f)["n"]


class EveryKSteps(tune.Callback):
    """Ray's CheckpointByStepsTaken pattern."""

    def __init__(self, k):
        self.k = k
        self.asked: dict[str, list[int]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        it = result["training_iteration"]
        if it % self.k == 0:
            result[SHOULD_CHECKPOINT] = True
            self.asked.setdefault(trial.trial_id, []).append(it)


def _checkpoint_iterations(result):
    its = []
    for ckpt, metrics in result.best_checkpoints:
        with ckpt.as_directory() as d, open(os.path.join(d, "n.json")) as f:
            its.append(json.load(f)["n"])
        assert metrics["training_iteration"] == its[-1]
    return sorted(its)


def test_callback_asks_a_class_trainable_for_checkpoints(local_client, storage_path):
    cb = EveryKSteps(4)
    results = tune.Tuner(
        Stepper, param_space={"x": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(name="ondemand", storage_path=storage_path, verbose=0,
                                  callbacks=[cb], stop={"training_iteration": 12}),
    ).fit()
    assert results.num_terminated == 2 and not results.errors
    for r in results:
        asked = cb.asked[r.metrics["trial_id"]]
        assert asked == [4, 8, 12]
        its = _checkpoint_iterations(r)
        assert its, "no checkpoint was taken"
        # Each one was asked for: never before the first request, never more than asked.
        assert its[0] >= 4 and len(its) <= len(asked)
        assert r.checkpoint is not None


def test_without_requests_no_checkpoint(local_client, storage_path):
    results = tune.Tuner(
        Stepper, run_config=tune.RunConfig(name="none", storage_path=storage_path, verbose=0,
                                           stop={"training_iteration": 5}),
    ).fit()
    assert results[0].checkpoint is None and results[0].best_checkpoints == []
