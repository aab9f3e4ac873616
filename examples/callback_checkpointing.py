"""Checkpoints a class Trainable asks for itself, seen through a ``Callback``.

Ray Tune's checkpoint-on-demand pattern with ``import dasktune as tune``: ``step()``
adds ``dasktune.result.SHOULD_CHECKPOINT: True`` to its result whenever the loss hit a
new best, so only improving states are saved; a ``tune.Callback`` hears about every
committed checkpoint (``on_checkpoint``) and counts them per trial.

    python examples/callback_checkpointing.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import dasktune as tune
from dasktune.result import SHOULD_CHECKPOINT


class NoisyDescent(tune.Trainable):
    """A loss that improves with noise: checkpoint only on a new best."""

    def setup(self, config: dict) -> None:
        self.x = 5.0
        self.best = math.inf

    def step(self) -> dict:
        self.x -= self.config["lr"] * 2 * self.x  # gradient step on x**2
        loss = self.x ** 2 + 0.1 * math.sin(3 * self.iteration)  # wiggles: not monotone
        result: dict[str, Any] = {"loss": loss}
        if loss < self.best:
            self.best = loss
            result[SHOULD_CHECKPOINT] = True
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
            json.dump({"x": self.x, "best": self.best}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            state = json.load(f)
        self.x, self.best = state["x"], state["best"]


class CountCheckpoints(tune.Callback):
    """Counts the committed checkpoints of each trial."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any,
                      **info: Any) -> None:
        self.counts[trial.trial_id] = self.counts.get(trial.trial_id, 0) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    counter = CountCheckpoints()
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            NoisyDescent,
            param_space={"lr": tune.grid_search([0.05, 0.2])},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(
                name="callback_checkpointing", storage_path=args.storage_path, verbose=1,
                stop={"training_iteration": 8 if args.smoke_test else 50},
                callbacks=[counter],
                checkpoint_config=tune.CheckpointConfig(
                    num_to_keep=2, checkpoint_score_attribute="loss",
                    checkpoint_score_order="min"),
            ),
        )
        results = tuner.fit()
        best = results.get_best_result()
        print("Checkpoints committed per trial:", sorted(counter.counts.values()))
        print("Best hyperparameters found were:", best.config)
        with best.checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                print("Best checkpoint state:", json.load(f))
        if results.errors:  # a failed trial fails the script
            print(f"{results.num_errors} trial(s) failed:", *results.errors, sep="\n",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        tune.shutdown()


if __name__ == "__main__":
    sys.exit(main())
