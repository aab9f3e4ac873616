"""Early stopping with ASHA (asynchronous successive halving).

Ray Tune's ``async_hyperband_example.py`` with ``import dasktune as tune``: trials
report a synthetic loss every iteration, and ``AsyncHyperBandScheduler`` stops the
ones in the bottom part of each rung so the budget goes to promising configs.

    python examples/async_hyperband_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import sys
import time

import dasktune as tune
from dasktune.schedulers import AsyncHyperBandScheduler


def evaluation_fn(step: int, width: float, height: float) -> float:
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def easy_objective(config: dict) -> None:
    for step in range(config["steps"]):
        tune.report({"iterations": step,
                     "mean_loss": evaluation_fn(step, config["width"], config["height"])})
        time.sleep(config["sleep"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    max_t = 12 if args.smoke_test else 100
    scheduler = AsyncHyperBandScheduler(time_attr="training_iteration", max_t=max_t,
                                        grace_period=2 if args.smoke_test else 10,
                                        reduction_factor=3)
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            tune.with_resources(easy_objective, {"cpu": 1}),
            param_space={
                "steps": max_t,
                "sleep": 0.0 if args.smoke_test else 0.05,
                "width": tune.uniform(10, 100),
                "height": tune.uniform(0, 100),
            },
            # The smoke run is seeded: its third config is worse at the first rung than
            # both before it, so on two slots ASHA stops it there, every run.
            tune_config=tune.TuneConfig(metric="mean_loss", mode="min", scheduler=scheduler,
                                        num_samples=6 if args.smoke_test else 20,
                                        seed=0 if args.smoke_test else None),
            run_config=tune.RunConfig(name="asynchyperband_test", storage_path=args.storage_path,
                                      stop={"training_iteration": max_t}, verbose=1),
        )
        results = tuner.fit()
        iters = sorted(r.metrics.get("training_iteration", 0) for r in results)
        print("Iterations per trial:", iters)
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
