"""Quickstart: tune a small scikit-learn model on the digits data set.

Runs on the embedded local cluster (no address) or any Dask cluster
(``python examples/quickstart.py --address tcp://host:8786``).
"""

from __future__ import annotations

import argparse

import dasktune as tune


def train_digits(config):
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.25, random_state=0)
    model = SGDClassifier(alpha=config["alpha"], loss=config["loss"], random_state=0)
    classes = sorted(set(y))
    for _epoch in range(config["epochs"]):
        model.partial_fit(X_train, y_train, classes=classes)
        tune.report({"mean_accuracy": model.score(X_val, y_val)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--smoke-test", action="store_true")
    args = parser.parse_args()

    tune.init(address=args.address)
    tuner = tune.Tuner(
        train_digits,
        param_space={
            "alpha": tune.loguniform(1e-6, 1e-1),
            "loss": tune.grid_search(["hinge", "log_loss"]),
            "epochs": 5 if args.smoke_test else 20,
        },
        tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max",
                                    num_samples=2 if args.smoke_test else args.num_samples),
        run_config=tune.RunConfig(name="quickstart", verbose=2),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best config: {best.config}  accuracy: {best.metrics['mean_accuracy']:.4f}")
    print(f"results in: {results.experiment_path}")
    tune.shutdown()


if __name__ == "__main__":
    main()
