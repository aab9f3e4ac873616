"""The same experiment on the embedded cluster or on any Dask cluster.

    python examples/tune_script.py                              # local
    python examples/tune_script.py --address tcp://host:8786    # a running Dask cluster

As with Ray's ``tune_script.py``: nothing but the address changes.
"""

from __future__ import annotations

import argparse
import time

import dasktune as tune


def objective(step: int, width: float, height: float) -> float:
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def trainable(config):
    for step in range(config["steps"]):
        tune.report({"iterations": step, "mean_loss": objective(step, config["width"],
                                                                 config["height"])})
        time.sleep(0.03)  # ~3 s a trial: long enough to be caught running (chaos)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default=None,
                        help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    parser.add_argument("--smoke-test", action="store_true")
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    tune.init(address=args.address)
    results = tune.Tuner(
        trainable,
        param_space={"steps": 10 if args.smoke_test else 100,
                     "width": tune.uniform(0, 20), "height": tune.uniform(-100, 100)},
        tune_config=tune.TuneConfig(metric="mean_loss", mode="min",
                                    num_samples=4 if args.smoke_test else 20),
        run_config=tune.RunConfig(name="tune_script", storage_path=args.storage_path),
    ).fit()
    print("Best hyperparameters found were:", results.get_best_result().config)
    tune.shutdown()
