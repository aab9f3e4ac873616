"""The checkpointing class Trainable: a small PyTorch MLP on scikit-learn's digits.

Ray Tune's ``mnist_pytorch_trainable.py`` with ``import dasktune as tune``, on the
8x8 ``load_digits`` images that ship with scikit-learn (no download). ``setup`` builds
the model and data, ``step`` trains one epoch and returns the validation accuracy,
``save_checkpoint``/``load_checkpoint`` persist the model and optimizer, and ASHA stops
poor ``lr``/``momentum`` choices early.

    pip install torch scikit-learn
    python examples/digits_pytorch_trainable.py --smoke-test
"""

from __future__ import annotations

import argparse
import os
import sys

import dasktune as tune
from dasktune.schedulers import ASHAScheduler


class TrainDigits(tune.Trainable):
    """One ``step`` is one epoch of SGD over the training split."""

    def setup(self, config: dict) -> None:
        import torch
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        torch.manual_seed(0)
        torch.set_num_threads(1)  # one trial per core: no oversubscription
        x, y = load_digits(return_X_y=True)
        x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.25,
                                                          random_state=0)
        self.x_train = torch.tensor(x_train, dtype=torch.float32)
        self.y_train = torch.tensor(y_train)
        self.x_val = torch.tensor(x_val, dtype=torch.float32)
        self.y_val = torch.tensor(y_val)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, config.get("hidden", 32)), torch.nn.ReLU(),
            torch.nn.Linear(config.get("hidden", 32), 10),
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config["lr"],
                                         momentum=config["momentum"])
        self.batch_size = config.get("batch_size", 64)

    def step(self) -> dict:
        import torch

        self.model.train()
        order = torch.randperm(len(self.x_train))
        total = 0.0
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            self.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x_train[idx]),
                                                     self.y_train[idx])
            loss.backward()
            self.optimizer.step()
            total += float(loss) * len(idx)
        self.model.eval()
        with torch.no_grad():
            accuracy = float((self.model(self.x_val).argmax(1) == self.y_val).float().mean())
        return {"mean_accuracy": accuracy, "train_loss": total / len(order)}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        import torch

        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(checkpoint_dir, "model.pt"))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        import torch

        state = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def reset_config(self, new_config: dict) -> bool:
        for group in self.optimizer.param_groups:
            group["lr"] = new_config["lr"]
            group["momentum"] = new_config["momentum"]
        self.config = new_config
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Dask scheduler address")
    parser.add_argument("--smoke-test", action="store_true", help="finish in seconds")
    parser.add_argument("--storage-path", default=None, help="results root (fsspec URL)")
    args = parser.parse_args(argv)

    max_t = 4 if args.smoke_test else 20
    scheduler = ASHAScheduler(max_t=max_t, grace_period=1, reduction_factor=2)
    tune.init(address=args.address)
    try:
        tuner = tune.Tuner(
            tune.with_resources(TrainDigits, {"cpu": 1}),
            param_space={"lr": tune.uniform(0.001, 0.1), "momentum": tune.uniform(0.1, 0.9)},
            tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max",
                                        scheduler=scheduler,
                                        num_samples=4 if args.smoke_test else 20),
            run_config=tune.RunConfig(
                name="digits_pytorch_trainable", storage_path=args.storage_path, verbose=1,
                stop={"mean_accuracy": 0.99, "training_iteration": max_t},
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True,
                                                        checkpoint_frequency=2),
            ),
        )
        results = tuner.fit()
        best = results.get_best_result()
        print("Best hyperparameters found were:", best.config)
        print(f"Best validation accuracy: {best.metrics['mean_accuracy']:.4f}")
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
