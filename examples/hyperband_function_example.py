"""Synchronous HyperBand over a function trainable that checkpoints itself.

Ray Tune's ``hyperband_function_example.py`` with ``import dasktune as tune``.
HyperBand pauses trials at the end of each band and resumes the best ones later, so
the function saves its state with every report (``tune.Checkpoint.from_directory``)
and picks it up again with ``tune.get_checkpoint()`` when it is resumed.

    python examples/hyperband_function_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import dasktune as tune
from dasktune.schedulers import HyperBandScheduler


def train_func(config: dict) -> None:
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # resumed after a pause: continue where it stopped
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                step = json.load(f)["timestep"] + 1

    while True:
        v = math.tanh(step / config["width"]) * config["height"]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"timestep": step}, f)
            tune.report({"episode_reward_mean": v, "timestep": step},
                        checkpoint=tune.Checkpoint.from_directory(d))
        step += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    max_t = 9 if args.smoke_test else 200
    scheduler = HyperBandScheduler(max_t=max_t, reduction_factor=3)
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            train_func,
            param_space={"height": tune.uniform(0, 100), "width": tune.randint(1, 20)},
            tune_config=tune.TuneConfig(metric="episode_reward_mean", mode="max",
                                        scheduler=scheduler,
                                        num_samples=6 if args.smoke_test else 20),
            run_config=tune.RunConfig(name="hyperband_test", storage_path=args.storage_path,
                                      stop={"training_iteration": 10 if args.smoke_test
                                            else 1000},
                                      verbose=1),
        )
        results = tuner.fit()
        best = results.get_best_result()
        print("Iterations per trial:",
              sorted(r.metrics.get("training_iteration", 0) for r in results))
        # A trial HyperBand paused and later resumed restarted its iterations_since_restore.
        resumed = sum(1 for r in results
                      if r.metrics.get("iterations_since_restore", 0)
                      < r.metrics.get("training_iteration", 0))
        print("Trials paused and resumed from a checkpoint:", resumed)
        print("Best hyperparameters found were:", best.config)
        print("Best checkpoint:", best.checkpoint.path if best.checkpoint else None)
        if results.errors:  # a failed trial fails the script
            print(f"{results.num_errors} trial(s) failed:", *results.errors, sep="\n",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        tune.shutdown()


if __name__ == "__main__":
    sys.exit(main())
