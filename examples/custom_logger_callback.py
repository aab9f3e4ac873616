"""A custom ``LoggerCallback``: log results your own way, in the driver.

Ray Tune's ``custom_logger_callback.py`` with ``import dasktune as tune``: a subclass of
``dasktune.logger.LoggerCallback`` overrides ``log_trial_start``/``log_trial_result``/
``log_trial_end`` and is passed in ``RunConfig(callbacks=[...])``. Here it prints one
line per result with a prefix and writes a small summary file per trial.

    python examples/custom_logger_callback.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import dasktune as tune
from dasktune.logger import LoggerCallback


class CustomLoggerCallback(LoggerCallback):
    """Prints every result and writes ``<trial dir>/custom_summary.json`` at the end."""

    def __init__(self, prefix: str = "[custom]") -> None:
        self.prefix = prefix
        self.num_results: dict[str, int] = {}
        self.last: dict[str, dict[str, Any]] = {}

    def log_trial_start(self, trial: Any) -> None:
        self.num_results[trial.trial_id] = 0
        print(f"{self.prefix} started {trial.trial_id} with {trial.config}")

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        self.num_results[trial.trial_id] = self.num_results.get(trial.trial_id, 0) + 1
        self.last[trial.trial_id] = {"training_iteration": result["training_iteration"],
                                     "loss": result["loss"]}
        print(f"{self.prefix} {trial.trial_id} iter={result['training_iteration']} "
              f"loss={result['loss']:.4f}")

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        summary = {"failed": failed, "num_results": self.num_results.get(trial.trial_id, 0),
                   "last": self.last.get(trial.trial_id)}
        if trial.path and os.path.isdir(trial.path):  # local storage: write beside the trial
            with open(os.path.join(trial.path, "custom_summary.json"), "w") as f:
                json.dump(summary, f)
        print(f"{self.prefix} ended {trial.trial_id}: {summary}")


def trainable(config: dict) -> None:
    for i in range(config["steps"]):
        tune.report({"loss": config["lr"] * 10 / (i + 1)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            trainable,
            param_space={"lr": tune.grid_search([0.01, 0.1]),
                         "steps": 3 if args.smoke_test else 10},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(name="custom_logger_callback", verbose=0,
                                      storage_path=args.storage_path,
                                      callbacks=[CustomLoggerCallback()]),
        )
        results = tuner.fit()
        print("Best hyperparameters found were:", results.get_best_result().config)
        if results.errors:  # a failed trial fails the script
            print(f"{results.num_errors} trial(s) failed:", *results.errors, sep="\n",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        tune.shutdown()


if __name__ == "__main__":
    sys.exit(main())
