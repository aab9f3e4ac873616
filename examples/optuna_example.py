"""Optuna's TPE sampler as the search algorithm.

Ray Tune's ``optuna_example.py`` with ``import dasktune as tune``: the Tuner's
``param_space`` is translated into Optuna distributions by ``OptunaSearch``, and
``ConcurrencyLimiter`` keeps a few trials in flight so the sampler learns between them.

    python examples/optuna_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import sys
import time

import dasktune as tune
from dasktune.search import ConcurrencyLimiter
from dasktune.search.optuna import OptunaSearch


def evaluate(step: int, width: float, height: float, activation: str) -> float:
    activation_boost = 10 if activation == "relu" else 0
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + activation_boost


def objective(config: dict) -> None:
    for step in range(config["steps"]):
        score = evaluate(step, config["width"], config["height"], config["activation"])
        tune.report({"iterations": step, "mean_loss": score})
        time.sleep(config["sleep"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    searcher = ConcurrencyLimiter(OptunaSearch(seed=0), max_concurrent=2)
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
            tune_config=tune.TuneConfig(metric="mean_loss", mode="min", search_alg=searcher,
                                        num_samples=6 if args.smoke_test else 100),
            run_config=tune.RunConfig(name="optuna_example", storage_path=args.storage_path,
                                      verbose=1),
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
