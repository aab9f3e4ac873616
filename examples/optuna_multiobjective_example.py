"""Multi-objective search with Optuna's NSGA-II sampler.

Ray Tune's ``optuna_multiobjective_example.py`` with ``import dasktune as tune``:
``metric`` and ``mode`` are lists (minimise ``loss``, maximise ``gain``), the study
keeps a Pareto front, and ``get_best_result`` picks the best trial per objective.

    python examples/optuna_multiobjective_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import sys
import time

import optuna

import dasktune as tune
from dasktune.search import ConcurrencyLimiter
from dasktune.search.optuna import OptunaSearch


def evaluate(step: int, width: float, height: float, activation: str) -> float:
    activation_boost = 10 if activation == "relu" else 1
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + activation_boost


def objective(config: dict) -> None:
    for step in range(config["steps"]):
        v = evaluate(step, config["width"], config["height"], config["activation"])
        # two conflicting goals: a low loss wants a small height, a high gain a large one
        tune.report({"iterations": step, "loss": v, "gain": v * config["height"] / 10})
        time.sleep(config["sleep"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    searcher = OptunaSearch(metric=["loss", "gain"], mode=["min", "max"],
                            sampler=optuna.samplers.NSGAIISampler(seed=0))
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            objective,
            param_space={
                "steps": 5 if args.smoke_test else 100,
                "sleep": 0.0 if args.smoke_test else 0.05,
                "width": tune.uniform(0, 20),
                "height": tune.uniform(-100, 100),
                "activation": tune.choice(["relu", "tanh"]),
            },
            tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, 2),
                                        num_samples=6 if args.smoke_test else 100),
            run_config=tune.RunConfig(name="optuna_multiobjective", verbose=1,
                                      storage_path=args.storage_path),
        )
        results = tuner.fit()
        print("Best hyperparameters for loss found were:",
              results.get_best_result("loss", "min").config)
        print("Best hyperparameters for gain found were:",
              results.get_best_result("gain", "max").config)
        if results.errors:  # a failed trial fails the script
            print(f"{results.num_errors} trial(s) failed:", *results.errors, sep="\n",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        tune.shutdown()


if __name__ == "__main__":
    sys.exit(main())
