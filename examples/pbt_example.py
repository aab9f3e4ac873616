"""Population Based Training of a class Trainable on a toy problem.

Ray Tune's ``pbt_example.py`` with ``import dasktune as tune``. The toy's progress per
step is largest when ``lr`` is close to an optimum that moves as training goes on, so
no fixed ``lr`` wins: PBT copies the checkpoints of good trials into poor ones
(``save_checkpoint``/``load_checkpoint``) and perturbs their ``lr``.

    python examples/pbt_example.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import dasktune as tune
from dasktune.schedulers import PopulationBasedTraining


class PBTBenchmarkExample(tune.Trainable):
    """Accuracy climbs fastest while ``lr`` tracks an optimum that decays with accuracy."""

    def setup(self, config: dict) -> None:
        self.lr = config["lr"]
        self.accuracy = 0.0  # the "weights" of this toy model

    def step(self) -> dict:
        midpoint = 100  # the optimal lr falls as accuracy passes this point
        q_tolerance = 3  # how far from the optimum an lr still helps
        noise_level = 2
        optimal_lr = 0.01 if self.accuracy < midpoint else 0.001
        if self.accuracy > midpoint * 1.5:
            optimal_lr = 0.0001
        q_err = max(self.lr, optimal_lr) / min(self.lr, optimal_lr)
        if q_err < q_tolerance:  # within tolerance: progress, more the closer it is
            self.accuracy += (1.0 / q_err) * random.random()
        elif self.lr > optimal_lr:  # far too high: it falls back
            self.accuracy -= (q_err - q_tolerance) * random.random()
        self.accuracy += noise_level * random.normalvariate(0, 1)
        self.accuracy = max(0.0, self.accuracy)
        return {"mean_accuracy": self.accuracy, "cur_lr": self.lr,
                "optimal_lr": optimal_lr, "q_err": q_err}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
            json.dump({"accuracy": self.accuracy, "lr": self.lr}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            self.accuracy = json.load(f)["accuracy"]

    def reset_config(self, new_config: dict) -> bool:
        self.lr = new_config["lr"]
        self.config = new_config
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=5 if args.smoke_test else 20,
        hyperparam_mutations={"lr": lambda: random.uniform(0.0001, 0.02),
                              "some_other_factor": [1, 2]},
        seed=0,
    )
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            PBTBenchmarkExample,
            param_space={"lr": 0.0001, "some_other_factor": 1},
            tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max", scheduler=pbt,
                                        num_samples=4 if args.smoke_test else 8,
                                        reuse_actors=True),
            run_config=tune.RunConfig(
                name="pbt_class_api_example", storage_path=args.storage_path, verbose=1,
                stop={"training_iteration": 20 if args.smoke_test else 300},
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=5,
                                                        num_to_keep=4),
            ),
        )
        results = tuner.fit()
        print("Final lr per trial:",
              sorted(round(r.config["lr"], 5) for r in results))
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
