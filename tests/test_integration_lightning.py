"""PyTorch Lightning callbacks in real Tuner runs: a tiny LightningModule on CPU
reports its validation loss once per epoch, and the checkpoint that comes with each
report loads back (``load_from_checkpoint``) into the model that had that loss."""

from __future__ import annotations

import os

import pytest

import dasktune as tune

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

EPOCHS = 3


class Tiny(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _loaders():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    data = torch.utils.data.TensorDataset(x, y)
    return (torch.utils.data.DataLoader(data, batch_size=16),
            torch.utils.data.DataLoader(data, batch_size=64))


def _trainer(callback):
    return pl.Trainer(max_epochs=EPOCHS, callbacks=[callback], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1,
                      default_root_dir=tune.get_context().get_trial_dir())


def train_checkpointing(config):
    from dasktune.integration.pytorch_lightning import TuneReportCheckpointCallback

    torch.manual_seed(0)
    train, val = _loaders()
    callback = TuneReportCheckpointCallback({"loss": "val_loss"}, filename="model.ckpt")
    _trainer(callback).fit(Tiny(config["lr"]), train, val)


def test_reports_each_epoch_with_a_checkpoint_that_loads_back(local_client, storage_path):
    grid = tune.Tuner(
        train_checkpointing, param_space={"lr": tune.grid_search([0.01, 0.05])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=storage_path, name="ptl"),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    _, val = _loaders()
    for result in grid:
        df = result.metrics_dataframe
        assert len(df) == EPOCHS  # once per validation, none for the sanity check
        checkpoints = sorted(result.best_checkpoints, key=lambda cm: cm[1]["training_iteration"])
        assert len(checkpoints) == EPOCHS
        for epoch, (checkpoint, metrics) in enumerate(checkpoints):
            path = os.path.join(checkpoint.path, "model.ckpt")
            assert torch.load(path, weights_only=False)["epoch"] == epoch
            model = Tiny.load_from_checkpoint(path)
            assert model.hparams.lr == result.config["lr"]
            x, y = next(iter(val))
            with torch.no_grad():
                loss = torch.nn.functional.mse_loss(model.layer(x), y).item()
            assert loss == pytest.approx(metrics["loss"], rel=1e-5)
            assert df["loss"][epoch] == pytest.approx(metrics["loss"], rel=1e-5)
        assert df["loss"].iloc[-1] < df["loss"].iloc[0]


def train_report_only(config):
    from dasktune.integration.lightning import TuneReportCallback

    train, val = _loaders()
    with pytest.warns(DeprecationWarning):
        callback = TuneReportCallback(["val_loss", "not_logged"], on=config["on"])
    _trainer(callback).fit(Tiny(), train, val)


def test_report_only_callback_at_another_hook(local_client, storage_path):
    grid = tune.Tuner(train_report_only, param_space={"on": tune.grid_search(
        ["validation_end", ["train_end"]])},
        run_config=tune.RunConfig(storage_path=storage_path, name="ptl-report")).fit()
    assert grid.num_errors == 0, grid.errors
    counts = {r.config["on"] if isinstance(r.config["on"], str) else "train_end":
              len(r.metrics_dataframe) for r in grid}
    assert counts == {"validation_end": EPOCHS, "train_end": 1}
    for result in grid:
        assert result.checkpoint is None
        assert "val_loss" in result.metrics and "not_logged" not in result.metrics


def test_an_unknown_hook_is_refused():
    from dasktune.integration.pytorch_lightning import TuneReportCheckpointCallback

    with pytest.raises(ValueError, match="'validation_ends'.*validation_end"):
        TuneReportCheckpointCallback(on="validation_ends")
