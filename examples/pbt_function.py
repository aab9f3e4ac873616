"""Population Based Training with a function trainable that checkpoints itself.

Ray Tune's ``pbt_function.py`` with ``import dasktune as tune``. The function restores
its state from ``tune.get_checkpoint()`` and reports a checkpoint at every
perturbation boundary, so PBT can clone a good trial's state into a poor one and
continue it with an explored ``lr``.

    python examples/pbt_function.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

import dasktune as tune
from dasktune.schedulers import PopulationBasedTraining


def pbt_function(config: dict) -> None:
    """Accuracy grows fastest when ``lr`` is near an optimum that shrinks as it grows."""
    lr = config["lr"]
    accuracy = 0.0
    step = 1
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # cloned from a donor (or resumed): start from its state
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                state = json.load(f)
        accuracy, step = state["acc"], state["step"] + 1

    midpoint, q_tolerance, noise_level = 100, 3, 2
    while True:
        optimal_lr = 0.01 if accuracy < midpoint else 0.001
        if accuracy > midpoint * 1.5:
            optimal_lr = 0.0001
        q_err = max(lr, optimal_lr) / min(lr, optimal_lr)
        if q_err < q_tolerance:
            accuracy += (1.0 / q_err) * random.random()
        elif lr > optimal_lr:
            accuracy -= (q_err - q_tolerance) * random.random()
        accuracy = max(0.0, accuracy + noise_level * random.normalvariate(0, 1))

        metrics = {"mean_accuracy": accuracy, "cur_lr": lr, "optimal_lr": optimal_lr,
                   "q_err": q_err, "done": accuracy > midpoint * 2}
        if step % config["checkpoint_interval"] == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"acc": accuracy, "step": step}, f)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)
        step += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    interval = 4 if args.smoke_test else 10  # checkpoint exactly where PBT may perturb
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=interval,
        metric="mean_accuracy",
        mode="max",
        hyperparam_mutations={"lr": tune.uniform(0.0001, 0.02)},
        seed=0,
    )
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            pbt_function,
            param_space={"lr": tune.choice([0.0001, 0.001, 0.01, 0.02]),
                         "checkpoint_interval": interval},
            tune_config=tune.TuneConfig(scheduler=pbt,
                                        num_samples=4 if args.smoke_test else 8),
            run_config=tune.RunConfig(
                name="pbt_function_api_example", storage_path=args.storage_path,
                verbose=1, stop={"training_iteration": 16 if args.smoke_test else 300},
                checkpoint_config=tune.CheckpointConfig(num_to_keep=4),
            ),
        )
        results = tuner.fit()
        # PBT knows the metric, the results don't: name it here (as in Ray)
        best = results.get_best_result(metric="mean_accuracy", mode="max")
        print("Best hyperparameters found were:", best.config)
        print("Best mean_accuracy:", round(best.metrics["mean_accuracy"], 3))
        if results.errors:  # a failed trial fails the script
            print(f"{results.num_errors} trial(s) failed:", *results.errors, sep="\n",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        tune.shutdown()


if __name__ == "__main__":
    sys.exit(main())
