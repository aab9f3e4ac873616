"""Random search combined with a grid: the smallest complete tuning run.

Ray Tune's ``tune_basic_example.py`` with ``import dasktune as tune``: each trial
reports a synthetic loss that depends on ``width``/``height`` (sampled at random)
and ``activation`` (a grid axis), and the best config is printed at the end.

    python examples/tune_basic_example.py --smoke-test
    python examples/tune_basic_example.py --address tcp://host:8786
"""

from __future__ import annotations

import argparse
import sys
import time

import dasktune as tune


def evaluation_fn(step: int, width: float, height: float, activation: str) -> float:
    """A loss that falls with ``step`` and ``width``; ``relu`` is a little better."""
    bonus = 0.0 if activation == "relu" else 1.0
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + bonus


def easy_objective(config: dict) -> None:
    for step in range(config["steps"]):
        loss = evaluation_fn(step, config["width"], config["height"], config["activation"])
        tune.report({"iterations": step, "mean_loss": loss})
        time.sleep(config["sleep"])


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
            easy_objective,
            param_space={
                "steps": 5 if args.smoke_test else 100,
                "sleep": 0.0 if args.smoke_test else 0.05,
                "width": tune.uniform(0, 20),
                "height": tune.uniform(-100, 100),
                "activation": tune.grid_search(["relu", "tanh"]),
            },
            tune_config=tune.TuneConfig(metric="mean_loss", mode="min",
                                        num_samples=2 if args.smoke_test else 10),
            run_config=tune.RunConfig(name="tune_basic_example",
                                      storage_path=args.storage_path, verbose=1),
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
