"""A define-by-run Optuna search space, a concurrency limit and ASHA together.

Ray Tune's ``optuna_define_by_run_example.py`` with ``import dasktune as tune``: the
space is a function of an ``optuna.Trial`` so it can be conditional (``mult`` exists
only for ``relu``); the constants it returns join the config. ``ConcurrencyLimiter``
bounds the trials in flight and ``AsyncHyperBandScheduler`` stops poor ones early.

    python examples/optuna_define_by_run_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import dasktune as tune
from dasktune.schedulers import AsyncHyperBandScheduler
from dasktune.search import ConcurrencyLimiter
from dasktune.search.optuna import OptunaSearch

SMOKE_TEST = "--smoke-test" in sys.argv


def evaluate(step: int, width: float, height: float, mult: float = 1.0) -> float:
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 * mult


def objective(config: dict) -> None:
    for step in range(config["steps"]):
        # "mult" is only sampled on the relu branch of the define-by-run space
        score = evaluate(step, config["width"], config["height"], config.get("mult", 1.0))
        tune.report({"iterations": step, "mean_loss": score})
        time.sleep(config["sleep"])


def define_by_run_func(trial: Any) -> dict[str, Any]:
    """Sample with Optuna's ``trial.suggest_*``; return the constants of the config."""
    activation = trial.suggest_categorical("activation", ["relu", "tanh"])
    trial.suggest_float("width", 0, 20)
    trial.suggest_float("height", -100, 100)
    if activation == "relu":
        trial.suggest_float("mult", 1, 2)
    return {"steps": 8 if SMOKE_TEST else 100, "sleep": 0.0 if SMOKE_TEST else 0.05}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)
    global SMOKE_TEST
    SMOKE_TEST = args.smoke_test

    searcher = OptunaSearch(space=define_by_run_func, metric="mean_loss", mode="min", seed=0)
    searcher = ConcurrencyLimiter(searcher, max_concurrent=2)
    scheduler = AsyncHyperBandScheduler(grace_period=2, max_t=8 if args.smoke_test else 100)
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            objective,
            tune_config=tune.TuneConfig(metric="mean_loss", mode="min", search_alg=searcher,
                                        scheduler=scheduler,
                                        num_samples=6 if args.smoke_test else 100),
            run_config=tune.RunConfig(name="optuna_define_by_run", verbose=1,
                                      storage_path=args.storage_path),
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
