"""XGBoost and LightGBM callbacks inside real Tuner runs on the embedded cluster.

Each trial trains on scikit-learn's breast-cancer data with a fixed split; the test
trains the same booster again on the driver (both libraries are deterministic with
one thread) and checks that what Tune recorded is what the library logged, that the
checkpoints come at the rounds ``frequency`` and ``checkpoint_at_end`` say, and that
each loads with the library's own loader into the model the trial had.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import dasktune as tune

pytest.importorskip("sklearn")
ROUNDS = 6


def _data():
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    return train_test_split(x, y, test_size=0.25, random_state=0)


def _fit(trainable, param_space, storage_path):
    return tune.Tuner(
        trainable, param_space=param_space,
        run_config=tune.RunConfig(storage_path=storage_path, name="boost"),
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
    ).fit()


# ------------------------------------------------------------------ xgboost
def _xgb_params(depth):
    return {"objective": "binary:logistic", "eval_metric": ["logloss", "error"],
            "max_depth": depth, "eta": 0.3, "nthread": 1, "seed": 0}


def _xgb_train(config, callbacks=None):
    import xgboost as xgb

    train_x, test_x, train_y, test_y = _data()
    evals_result: dict = {}
    bst = xgb.train(_xgb_params(config["max_depth"]), xgb.DMatrix(train_x, label=train_y),
                    num_boost_round=ROUNDS, evals=[(xgb.DMatrix(test_x, label=test_y), "test")],
                    evals_result=evals_result, verbose_eval=False, callbacks=callbacks or [])
    return bst, evals_result, xgb.DMatrix(test_x)


def _xgb_trainable(config):
    from dasktune.integration.xgboost import TuneReportCheckpointCallback

    _xgb_train(config, [TuneReportCheckpointCallback(
        metrics={"loss": "test-logloss", "error": "test-error"},
        frequency=config["frequency"], checkpoint_at_end=True, filename="booster.json")])


def test_xgboost_reports_each_round_and_checkpoints_at_frequency(local_client, storage_path):
    pytest.importorskip("xgboost")
    from dasktune.integration.xgboost import TuneReportCheckpointCallback

    grid = _fit(_xgb_trainable, {"max_depth": tune.grid_search([2, 4]),
                                 "frequency": tune.grid_search([0, 4])}, storage_path)
    assert grid.num_errors == 0
    for result in grid:
        depth, frequency = result.config["max_depth"], result.config["frequency"]
        bst, evals, dtest = _xgb_train(result.config)
        df = result.metrics_dataframe
        # One report per round; checkpoint_at_end adds one unless round 6 was checkpointed.
        extra = 1 if frequency == 0 or ROUNDS % frequency else 0
        assert len(df) == ROUNDS + extra
        np.testing.assert_allclose(df["loss"][:ROUNDS], evals["test"]["logloss"], rtol=1e-6)
        np.testing.assert_allclose(df["error"][:ROUNDS], evals["test"]["error"], rtol=1e-6)
        rounds = [4, ROUNDS] if frequency == 4 else [ROUNDS]
        checkpoints = [c for c, _ in result.best_checkpoints]
        assert len(checkpoints) == len(rounds), (depth, frequency)
        import xgboost as xgb

        for checkpoint, n in zip(sorted(checkpoints, key=lambda c: c.path), rounds):
            own = xgb.Booster()
            own.load_model(os.path.join(checkpoint.path, "booster.json"))
            assert own.num_boosted_rounds() == n
        best = TuneReportCheckpointCallback.get_model(result.checkpoint, filename="booster.json")
        assert best.num_boosted_rounds() == ROUNDS
        np.testing.assert_allclose(best.predict(dtest), bst.predict(dtest), rtol=1e-6)


def test_xgboost_report_only_callback_and_bad_metric(local_client, storage_path):
    pytest.importorskip("xgboost")

    def trainable(config):
        from dasktune.integration.xgboost import TuneReportCallback

        _xgb_train(config, [TuneReportCallback(config["metrics"])])

    grid = _fit(trainable, {"max_depth": 3, "metrics": tune.grid_search(
        [{"loss": "test-logloss"}, ["test-nope"]])}, storage_path)
    ok, bad = sorted(grid, key=lambda r: r.error is not None)
    assert ok.checkpoint is None and len(ok.metrics_dataframe) == ROUNDS
    assert "loss" in ok.metrics and "test-error" not in ok.metrics
    assert "'test-nope' was not logged" in str(bad.error) and "test-logloss" in str(bad.error)


# ------------------------------------------------------------------ lightgbm
def _lgb_train(config, callbacks=None):
    import lightgbm as lgb

    train_x, test_x, train_y, test_y = _data()
    evals: dict = {}
    params = {"objective": "binary", "metric": ["binary_logloss", "binary_error"],
              "num_leaves": config["num_leaves"], "verbose": -1, "num_threads": 1,
              "deterministic": True, "seed": 0}
    bst = lgb.train(params, lgb.Dataset(train_x, label=train_y), num_boost_round=ROUNDS,
                    valid_sets=[lgb.Dataset(test_x, label=test_y)], valid_names=["eval"],
                    callbacks=[lgb.record_evaluation(evals), *(callbacks or [])])
    return bst, evals, test_x


def _lgb_trainable(config):
    from dasktune.integration.lightgbm import TuneReportCheckpointCallback

    _lgb_train(config, [TuneReportCheckpointCallback(
        {"loss": "eval-binary_logloss", "error": "eval-binary_error"},
        frequency=config["frequency"], checkpoint_at_end=config["at_end"])])


def test_lightgbm_reports_each_round_and_checkpoints_at_frequency(local_client, storage_path):
    pytest.importorskip("lightgbm")
    import lightgbm as lgb

    from dasktune.integration.lightgbm import TuneReportCheckpointCallback

    grid = _fit(_lgb_trainable, {"num_leaves": 7, "frequency": tune.grid_search([0, 4]),
                                 "at_end": tune.grid_search([True, False])}, storage_path)
    assert grid.num_errors == 0
    for result in grid:
        frequency, at_end = result.config["frequency"], result.config["at_end"]
        bst, evals, test_x = _lgb_train(result.config)
        df = result.metrics_dataframe
        assert len(df) == ROUNDS  # the end checkpoint rides on the last round's report
        np.testing.assert_allclose(df["loss"], evals["eval"]["binary_logloss"], rtol=1e-6)
        np.testing.assert_allclose(df["error"], evals["eval"]["binary_error"], rtol=1e-6)
        rounds = ([4] if frequency else []) + ([ROUNDS] if at_end else [])
        checkpoints = sorted((c for c, _ in result.best_checkpoints), key=lambda c: c.path)
        assert len(checkpoints) == len(rounds), (frequency, at_end)
        for checkpoint, n in zip(checkpoints, rounds):
            own = lgb.Booster(model_file=os.path.join(checkpoint.path, "model.txt"))
            assert own.current_iteration() == n
        if at_end:
            best = TuneReportCheckpointCallback.get_model(result.checkpoint)
            np.testing.assert_allclose(best.predict(test_x), bst.predict(test_x), rtol=1e-6)
