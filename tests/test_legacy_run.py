"""``tune.run(...)``, Ray's legacy entry point, as old scripts and online answers write it:
its arguments reach the Tuner, ``resume`` continues an experiment, and the returned
``ExperimentAnalysis`` answers ``best_config`` and friends."""

from __future__ import annotations

import json
import os

import pytest

import dasktune as tune
from dasktune.analysis import ExperimentAnalysis
from dasktune.legacy_run import resume_flags
from dasktune.trial import ERROR, TERMINATED


def quadratic(config):
    for i in range(config.get("iters", 4)):
        tune.report({"loss": (config["x"] - 1) ** 2 + 1.0 / (i + 1), "i": i})


class Counter(tune.Trainable):
    def setup(self, config):
        self.count = 0

    def step(self):
        self.count += 1
        return {"loss": abs(self.count - 3), "count": self.count}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "c.json"), "w") as f:
            json.dump({"count": self.count}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "c.json")) as f:
            self.count = json.load(f)["count"]


def fails_on_first_life(config):
    """Errors at its second step until the marker file exists (one run of the script)."""
    for i in range(3):
        if i == 1 and config["fail"] and not os.path.exists(config["marker"]):
            raise RuntimeError("first life fails")
        with open(config["log"], "a") as f:
            f.write(f"{config['x']}\n")
        tune.report({"score": config["x"] * 10 + i})


def test_run_returns_an_analysis_of_the_best(local_client, storage_path):
    analysis = tune.run(quadratic, config={"x": tune.grid_search([0, 1, 3]), "iters": 4},
                        metric="loss", mode="min", storage_path=storage_path, name="basic",
                        verbose=0)
    assert isinstance(analysis, tune.ExperimentAnalysis)
    assert isinstance(analysis, ExperimentAnalysis)  # Ray's dasktune.analysis path too
    assert analysis.experiment_path == os.path.join(storage_path, "basic")
    assert len(analysis.trials) == 3 and {t.status for t in analysis.trials} == {TERMINATED}
    assert analysis.best_config == {"x": 1, "iters": 4}
    assert analysis.best_result["loss"] == pytest.approx(0.25)
    assert analysis.best_trial.config["x"] == 1
    assert analysis.best_logdir == analysis.best_trial.path
    assert analysis.get_best_config("loss", "max")["x"] == 3
    assert analysis.get_best_trial("loss", "min", scope="all").config["x"] == 1
    frames = analysis.trial_dataframes
    assert sorted(len(df) for df in frames.values()) == [4, 4, 4]
    assert analysis.best_dataframe["loss"].tolist()[-1] == pytest.approx(0.25)
    df = analysis.dataframe()
    assert sorted(df["config/x"]) == [0, 1, 3] and (df["training_iteration"] == 4).all()
    first = analysis.dataframe(metric="loss", mode="max")  # each trial's worst: its first
    assert (first["training_iteration"] == 1).all()
    assert set(analysis.results) == {t.trial_id for t in analysis.trials}
    assert analysis.results_df.loc[analysis.best_trial.trial_id, "config/x"] == 1
    assert analysis.best_result_df.index.tolist() == [analysis.best_trial.trial_id]


def test_deprecated_checkpoint_arguments_and_best_checkpoint(local_client, storage_path):
    with pytest.warns(DeprecationWarning, match="checkpoint_freq"):
        analysis = tune.run(Counter, stop={"training_iteration": 5}, checkpoint_freq=1,
                            keep_checkpoints_num=2, checkpoint_score_attr="min-loss",
                            checkpoint_at_end=True, metric="loss", mode="min",
                            storage_path=storage_path, name="ckpt", verbose=0)
    trial = analysis.trials[0]
    kept = sorted(json.load(open(os.path.join(c.path, "c.json")))["count"]
                  for c in (analysis.get_best_checkpoint(trial, "count", "max"),
                            analysis.get_best_checkpoint(trial, "loss", "min")))
    assert kept == [3, 5]  # num_to_keep=2 by min loss: the best (3) and the newest (5)
    with analysis.best_checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "c.json")))["count"] == 3
    last = analysis.get_last_checkpoint(trial)
    assert json.load(open(os.path.join(last.path, "c.json")))["count"] == 5


def test_failures_registered_names_and_string_schedulers(local_client, storage_path, tmp_path):
    base = {"x": tune.grid_search([1, 2]), "marker": str(tmp_path / "m"),
            "log": str(tmp_path / "log")}
    with pytest.raises(tune.TuneError, match="Trials did not complete"):
        tune.run(fails_on_first_life, config={**base, "fail": True},
                 storage_path=storage_path, name="raises", verbose=0)
    analysis = tune.run(fails_on_first_life, config={**base, "fail": True},
                        raise_on_failed_trial=False, storage_path=storage_path,
                        name="kept", verbose=0)
    assert [t.status for t in analysis.trials] == [ERROR, ERROR]
    tune.register_trainable("legacy_quadratic", quadratic)
    analysis = tune.run("legacy_quadratic", config={"x": tune.uniform(0, 2), "iters": 3},
                        num_samples=3, scheduler="async_hyperband", search_alg="random",
                        metric="loss", mode="min", max_concurrent_trials=0,
                        storage_path=storage_path, name="named", verbose=0)
    assert len(analysis.trials) == 3
    assert analysis.best_result["loss"] == min(t.last_result["loss"] for t in analysis.trials)


def test_bad_arguments_are_named_before_any_work(storage_path):
    with pytest.raises(ValueError, match="must be one of \\['min', 'max'\\]"):
        tune.run(quadratic, mode="minimize", storage_path=storage_path)
    with pytest.raises(ValueError, match="`config` passed to `tune.run\\(...\\)` must be a dict"):
        tune.run(quadratic, config=[1], storage_path=storage_path)
    with pytest.raises(ValueError, match="max_failures must be 0 if fail_fast=True"):
        tune.run(quadratic, fail_fast=True, max_failures=2, storage_path=storage_path)
    with pytest.raises(DeprecationWarning, match="storage_path"):
        tune.run(quadratic, local_dir="/tmp/x")
    with pytest.raises(ValueError, match="GPU"):
        tune.run(quadratic, config={"x": 1}, resources_per_trial={"gpu": 1},
                 storage_path=storage_path, verbose=0)
    assert not os.path.exists(os.path.join(storage_path, "quadratic")), "no work was spent"


def test_resume_strings_map_to_restore_flags():
    assert resume_flags(None) is None and resume_flags(False) is None
    assert resume_flags(True) == {} and resume_flags("AUTO") == {}
    assert resume_flags("AUTO+ERRORED") == {"resume_errored": True}
    assert resume_flags("AUTO+RESTART_ERRORED") == {"restart_errored": True}
    assert resume_flags("AUTO+ERRORED_ONLY") == {"resume_unfinished": False,
                                                  "resume_errored": True}
    assert resume_flags("AUTO+RESTART_ERRORED_ONLY") == {"resume_unfinished": False,
                                                          "restart_errored": True}
    for removed in ("LOCAL", "REMOTE", "PROMPT", "ERRORED_ONLY"):
        with pytest.raises(DeprecationWarning, match=removed):
            resume_flags(removed)
    with pytest.raises(ValueError, match="Invalid resume setting"):
        resume_flags("AUTO+SOMETIMES")
    with pytest.raises(ValueError, match="Invalid resume setting"):
        resume_flags("MAYBE")


def test_resume_continues_the_experiment_and_reruns_only_the_errored(local_client,
                                                                     storage_path, tmp_path):
    log = tmp_path / "log"
    config = {"x": tune.grid_search([1, 2]), "marker": str(tmp_path / "m"), "log": str(log),
              "fail": tune.sample_from(lambda config: config["x"] == 2)}
    kw = dict(storage_path=storage_path, name="resumable", verbose=0, metric="score",
              mode="max", raise_on_failed_trial=False)
    # resume=True on an experiment that does not exist yet starts it (as Ray)
    first = tune.run(fails_on_first_life, config=config, resume=True, **kw)
    assert sorted(t.status for t in first.trials) == [ERROR, TERMINATED]
    assert sorted(log.read_text().split()) == ["1", "1", "1", "2"]
    (tmp_path / "m").touch()  # the bug is fixed; run the script again
    log.write_text("")
    # without +ERRORED, an errored trial stays errored and the finished one is not rerun
    again = tune.run(fails_on_first_life, config=config, resume="AUTO", **kw)
    assert sorted(t.status for t in again.trials) == [ERROR, TERMINATED]
    assert log.read_text() == ""
    fixed = tune.run(fails_on_first_life, config=config, resume="AUTO+RESTART_ERRORED", **kw)
    assert [t.status for t in fixed.trials] == [TERMINATED, TERMINATED]
    assert log.read_text().split() == ["2", "2", "2"]  # only the errored trial, from scratch
    assert fixed.best_config["x"] == 2 and fixed.best_result["score"] == 22
    # resume=False starts afresh under the same name
    fresh = tune.run(fails_on_first_life, config={**config, "x": 5, "fail": False},
                     resume=False, **kw)
    assert [t.config["x"] for t in fresh.trials] == [5]
