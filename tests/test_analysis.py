"""``ExperimentAnalysis(path)``: a finished experiment read back from its folder, as Ray
users do in a notebook after the run (no cluster, no trainable), with Ray's answers for
defaults, scopes, NaNs, unknown metrics and bad paths. (Remote storage: tests/test_s3.py.)"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

import dasktune as tune
from dasktune.analysis import ExperimentAnalysis


def curve(config):
    for i, v in enumerate(config["values"]):
        d = os.path.join(tune.get_context().get_trial_dir(), f"c{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "v.json"), "w") as f:
            json.dump({"i": i}, f)
        tune.report({"acc": v, "nested": {"m": v * 2}}, checkpoint=tune.Checkpoint.from_directory(d))


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Three trials: "steady" ends best, "peak" peaked early, "nan" ends in NaN."""
    import dasktune

    storage = str(tmp_path_factory.mktemp("analysis"))
    if not dasktune.is_initialized():
        dasktune.init(num_cpus=2, dashboard_address="127.0.0.1:0")
    space = {"name": tune.grid_search(["steady", "peak", "nan"]),
             "values": tune.sample_from(lambda config: {
                 "steady": [0.5, 0.6, 0.7], "peak": [0.9, 0.2, 0.1],
                 "nan": [0.8, 0.85, float("nan")]}[config["name"]])}
    tune.Tuner(curve, param_space=space,
               tune_config=tune.TuneConfig(metric="acc", mode="max"),
               run_config=tune.RunConfig(name="exp", storage_path=storage, verbose=0)).fit()
    return os.path.join(storage, "exp")


def by_name(analysis, trial):
    return trial.config["name"] if trial is not None else None


def test_reads_a_finished_experiment_with_its_own_metric(experiment):
    analysis = ExperimentAnalysis(experiment)
    assert analysis.default_metric == "acc" and analysis.default_mode == "max"
    assert len(analysis.trials) == 3
    assert by_name(analysis, analysis.best_trial) == "steady"  # a NaN last value never wins
    assert analysis.best_config["name"] == "steady"
    assert analysis.get_best_trial("acc", "max", scope="all").config["name"] == "peak"
    assert analysis.get_best_trial("acc", "max", scope="avg").config["name"] == "steady"
    assert analysis.get_best_trial("acc", "min", scope="last").config["name"] == "peak"
    assert analysis.get_best_trial("acc", "max", filter_nan_and_inf=False) is not None
    frames = analysis.trial_dataframes
    assert all(len(df) == 3 for df in frames.values())
    assert "nested/m" in next(iter(frames.values())).columns  # flattened as Ray's
    best_ckpt = analysis.get_best_checkpoint(analysis.best_trial, "acc", "max")
    assert json.load(open(os.path.join(best_ckpt.path, "v.json")))["i"] == 2
    peak = analysis.get_best_trial("acc", "max", scope="all")
    with analysis.get_best_checkpoint(peak).as_directory() as d:  # default: acc, max
        assert json.load(open(os.path.join(d, "v.json")))["i"] == 0
    assert json.load(open(os.path.join(analysis.get_last_checkpoint(peak).path,
                                       "v.json")))["i"] == 2


def test_paths_defaults_and_ray_errors(experiment):
    state = os.path.join(experiment, "experiment_state.json")
    for where in (pathlib.Path(experiment), state):
        assert len(ExperimentAnalysis(where).trials) == 3
    # given defaults win over the experiment's; a mode alone ranks Ray's "_metric"
    analysis = ExperimentAnalysis(experiment, default_metric="acc", default_mode="min")
    assert analysis.best_config["name"] == "peak"
    assert ExperimentAnalysis(experiment, default_mode="max").default_metric == "_metric"
    with pytest.raises(ValueError, match="default_mode"):
        ExperimentAnalysis(experiment, default_mode="best")
    assert ExperimentAnalysis(experiment).get_best_trial("no_such_metric", "max") is None
    with pytest.raises(ValueError, match="If set, `mode` has to be one of"):
        ExperimentAnalysis(experiment).get_best_trial("acc", "biggest")
    with pytest.raises(ValueError, match="No experiment snapshot file"):
        ExperimentAnalysis(os.path.dirname(experiment) + "/missing")
    with pytest.raises(ValueError, match="you'll also have to pass a `metric`"):
        ExperimentAnalysis(experiment).dataframe(mode="max")
    df = ExperimentAnalysis(experiment).dataframe(metric="acc", mode="max")
    assert sorted(df["acc"].dropna()) == [0.7, 0.85, 0.9]


def test_without_metric_best_raises_and_all_results_are_there(tmp_path, experiment):
    import dasktune

    tune.Tuner(curve, param_space={"name": "x", "values": [1.0, 2.0]},
               run_config=tune.RunConfig(name="plain", storage_path=str(tmp_path),
                                         verbose=0)).fit()
    assert dasktune.is_initialized()
    analysis = ExperimentAnalysis(tmp_path / "plain")
    with pytest.raises(ValueError, match="To fetch the `best_config`, pass a `metric`"):
        _ = analysis.best_config
    with pytest.raises(ValueError, match="To fetch the `best_checkpoint`"):
        _ = analysis.best_checkpoint
    trial = analysis.trials[0]
    assert analysis.get_best_trial() is trial  # one trial: the best without a metric (Ray)
    assert analysis.results[trial.trial_id]["acc"] == 2.0
    assert analysis.get_all_configs(prefix=True)[trial.trial_id] == {
        "config/name": "x", "config/values": [1.0, 2.0]}
    assert analysis.results_df.loc[trial.trial_id, "nested/m"] == 4.0


def test_a_fresh_process_reads_it_without_a_cluster(experiment):
    code = ("import dasktune as tune, dasktune.runtime as r; "
            f"a = tune.ExperimentAnalysis({experiment!r}); "
            "print(a.best_config['name'], len(a.dataframe()), r.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["steady", "3", "False"]


def test_nan_values_are_kept_in_the_frames(experiment):
    frames = ExperimentAnalysis(experiment).trial_dataframes
    lasts = sorted((df["acc"].tolist()[-1] for df in frames.values()),
                   key=lambda v: (math.isnan(v), v))
    assert lasts[:2] == [0.1, 0.7] and math.isnan(lasts[2])
