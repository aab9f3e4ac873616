"""Idioms of Ray Tune's own example scripts, found by running them after the import change:
trainables registered by name (``tune.register_trainable``), the examples' stand-in
``MyTrainableClass`` (``ray.tune.utils.mock_trainable``), and ``stop={"done": True}``."""

from __future__ import annotations

import math
import os

import pytest

import dasktune as tune
from dasktune import registry
from dasktune.schedulers import HyperBandScheduler
from dasktune.utils.mock_trainable import (
    MOCK_TRAINABLE_NAME,
    MyTrainableClass,
    register_mock_trainable,
)


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_TRAINABLES", {})


def counting(config):
    for i in range(config["n"]):
        tune.report({"i": i, "score": i * config["k"]})


def test_a_registered_trainable_runs_by_name(local_client, storage_path, clean_registry):
    tune.register_trainable("counting", counting)
    assert registry.registered_trainables() == ["counting"]
    grid = tune.Tuner("counting", param_space={"n": 3, "k": tune.grid_search([1, 2])},
                      run_config=tune.RunConfig(storage_path=storage_path, verbose=0),
                      tune_config=tune.TuneConfig(metric="score", mode="max")).fit()
    assert not grid.errors
    assert grid.get_best_result().metrics["score"] == 4
    # Ray names the experiment after the registered name
    assert os.path.basename(grid.experiment_path).startswith("counting_")


def test_an_unknown_name_fails_at_tuner_time_naming_what_is_registered(clean_registry):
    tune.register_trainable("counting", counting)
    with pytest.raises(ValueError, match=r"'countng'.*registered: 'counting'"):
        tune.Tuner("countng")
    with pytest.raises(TypeError, match="must be a function or a dasktune.Trainable"):
        tune.register_trainable("three", 3)
    with pytest.raises(TypeError, match="non-empty str"):
        tune.register_trainable("", counting)
    assert registry.registered_trainables() == ["counting"]


def test_mock_trainable_under_hyperband(local_client, storage_path, clean_registry):
    register_mock_trainable()
    grid = tune.Tuner(
        MOCK_TRAINABLE_NAME,
        param_space={"width": tune.randint(2, 20), "height": tune.randint(1, 100)},
        tune_config=tune.TuneConfig(num_samples=9, metric="episode_reward_mean", mode="max",
                                    scheduler=HyperBandScheduler(max_t=9)),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0,
                                  stop={"training_iteration": 9}),
    ).fit()
    assert not grid.errors and len(grid) == 9
    for result in grid:  # every curve is height * tanh(timestep / width)
        c, m = result.config, result.metrics
        assert m["episode_reward_mean"] == pytest.approx(
            c["height"] * math.tanh(m["training_iteration"] / c["width"]))
    best = grid.get_best_result()
    assert best.metrics["training_iteration"] == 9  # HyperBand ran the best to max_t


@pytest.mark.parametrize("persistent", [False, True])
def test_mock_error_fails_once_and_resumes_from_its_checkpoint(local_client, storage_path,
                                                               persistent):
    grid = tune.Tuner(
        MyTrainableClass,
        param_space={"mock_error": True, "persistent_error": persistent, "width": 2},
        run_config=tune.RunConfig(
            storage_path=storage_path, verbose=0, stop={"training_iteration": 4},
            failure_config=tune.FailureConfig(max_failures=1),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1)),
    ).fit()
    result = grid[0]
    if persistent:  # fails again after the restore: the one retry is spent
        assert result.error is not None and "failing on purpose" in str(result.error)
        assert result.metrics["training_iteration"] == 1
    else:  # restored from timestep 1, and a restored trainable does not fail
        assert result.error is None
        assert result.metrics["training_iteration"] == 4
        assert result.metrics["episode_reward_mean"] == pytest.approx(math.tanh(4 / 2))


def reports_done(config):
    for i in range(100):
        tune.report({"i": i, "done": i >= config["until"]})


class StepsUntilDone(tune.Trainable):
    def setup(self, config):
        self.i = -1

    def step(self):
        self.i += 1
        return {"i": self.i, "done": self.i >= self.config["until"]}


@pytest.mark.parametrize("trainable", [reports_done, StepsUntilDone])
def test_stop_on_a_reported_done_flag(local_client, storage_path, trainable):
    grid = tune.Tuner(
        trainable, param_space={"until": tune.grid_search([2, 5])},
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0,
                                  stop={"done": True, "training_iteration": 50}),
    ).fit()
    assert not grid.errors
    assert sorted(r.metrics["i"] for r in grid) == [2, 5]
