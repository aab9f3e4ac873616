"""Keras callbacks in a real Tuner run, on Keras 3 with its PyTorch backend (the ``keras``
extra; TensorFlow is no test dependency). A small model reports its logs per epoch; the
checkpoint of each epoch loads with ``keras.models.load_model`` into the model with the
logged loss."""

from __future__ import annotations

import os

import numpy as np
import pytest

import dasktune as tune

# Keras 3 picks its backend when first imported: PyTorch, here and in the trial's worker
# (a backend the user chose wins).
os.environ.setdefault("KERAS_BACKEND", "torch")

pytestmark = pytest.mark.slow
keras = pytest.importorskip("keras")

EPOCHS = 3


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")


def train(config):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    from dasktune.integration.keras import TuneReportCheckpointCallback

    x, y = _data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(config["lr"]), loss="mse")
    model.fit(x, y, epochs=EPOCHS, batch_size=16, validation_data=(x, y), verbose=0,
              callbacks=[TuneReportCheckpointCallback(metrics={"loss": "val_loss"})])


def test_reports_each_epoch_with_a_checkpoint_that_loads_back(local_client, storage_path):
    grid = tune.Tuner(train, param_space={"lr": 0.01},
                      run_config=tune.RunConfig(storage_path=storage_path, name="keras")).fit()
    assert grid.num_errors == 0, grid.errors
    (result,) = grid
    assert len(result.metrics_dataframe) == EPOCHS
    x, y = _data()
    checkpoints = sorted(result.best_checkpoints, key=lambda cm: cm[1]["training_iteration"])
    assert len(checkpoints) == EPOCHS
    for checkpoint, metrics in checkpoints:
        model = keras.models.load_model(os.path.join(checkpoint.path, "model.keras"))
        assert model.evaluate(x, y, verbose=0) == pytest.approx(metrics["loss"], rel=1e-4)


def test_unknown_hook_and_report_only_callback():
    from dasktune.integration.keras import TuneReportCallback, TuneReportCheckpointCallback

    with pytest.raises(ValueError, match="'epoch_ends'"):
        TuneReportCheckpointCallback(checkpoint_on="epoch_ends")
    with pytest.raises(ValueError, match="report_metrics_on.*'train_ends'"):
        TuneReportCallback(on="train_ends")
