"""Ray Tune facade details a migrating user relies on: submodules as attributes, trial
name creators, NaN-aware best results, fit-time checks, the class API's auto fields,
``dasktune.init`` arguments, and the inputs Ray accepts (tuples, arrays, timedeltas)."""

from __future__ import annotations

import datetime
import math
import os
import subprocess
import sys
import tempfile

import dask.config
import numpy as np
import pytest

import dasktune as tune
from dasktune import runtime, tuner_build
from dasktune.results import ResultGrid, result_from_trial
from dasktune.trial import Trial


def run(trainable, storage_path, name="exp", param_space=None, tc=None, **kw):
    rc = tune.RunConfig(name=name, storage_path=storage_path, verbose=0, **kw)
    return tune.Tuner(trainable, param_space=param_space or {},
                      tune_config=tune.TuneConfig(**(tc or {})), run_config=rc).fit()


def _trial(trial_id: str, values: list[float], metric: str = "loss") -> Trial:
    t = Trial(trial_id=trial_id, config={"id": trial_id})
    for i, v in enumerate(values, 1):
        t.update_last_result({metric: v, "training_iteration": i})
    return t


# ------------------------------------------------------------------ 1. submodules
def test_ray_submodules_are_attributes_without_importing_them():
    code = ("import dasktune as tune; "
            "print(tune.schedulers.ASHAScheduler.__name__, tune.search.ConcurrencyLimiter.__name__,"
            " tune.result.SHOULD_CHECKPOINT, tune.stopper.Stopper.__name__,"
            " tune.logger.LoggerCallback.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[1:] == ["ConcurrencyLimiter", "should_checkpoint", "Stopper", "LoggerCallback"]
    assert "schedulers" in dir(tune)
    with pytest.raises(AttributeError, match="no_such_thing"):
        tune.no_such_thing  # noqa: B018


# ------------------------------------------------------------------ 2. name creators
def test_name_creators_validate_what_they_return():
    trial = Trial(trial_id="abc", config={"x": 1}, trainable_name="train")
    tc = tune.TuneConfig(trial_name_creator=lambda t: f"{t.trainable_name}-{t.config['x']}",
                         trial_dirname_creator=lambda t: f"d_{t.trial_id}")
    tuner_build.apply_name_creators(trial, tc)
    assert (trial.trial_name, trial.dirname, str(trial)) == ("train-1", "d_abc", "train-1")
    for bad, match in ((lambda t: "a/b", "path separator"), (lambda t: "", "non-empty str"),
                       (lambda t: 3, "non-empty str")):
        with pytest.raises(ValueError, match=match):
            tuner_build.apply_name_creators(Trial("t", {}), tune.TuneConfig(
                trial_dirname_creator=bad))


def _named(config):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "w.txt"), "w") as f:
        f.write("w")
    # Ray's report signature: checkpoint_dir_name is an argument, never a metric.
    tune.report({"loss": float(config["x"]), "name": tune.get_context().get_trial_name()},
                checkpoint=tune.Checkpoint.from_directory(d), checkpoint_dir_name="mine")


def test_name_creators_name_trials_and_folders(local_client, storage_path):
    results = run(
        _named, storage_path, param_space={"x": tune.grid_search((1, 2))},
        tc=dict(metric="loss", mode="min", time_budget_s=datetime.timedelta(minutes=5),
                trial_name_creator=lambda t: f"{t.trainable_name}-{t.config['x']}",
                trial_dirname_creator=lambda t: f"folder_{t.config['x']}"),
    )
    assert not results.errors, results.errors
    assert sorted(r.metrics["name"] for r in results) == ["_named-1", "_named-2"]
    assert sorted(os.path.basename(r.path) for r in results) == ["folder_1", "folder_2"]
    assert all(os.path.exists(os.path.join(r.path, "result.json")) for r in results)
    assert all(r.checkpoint is not None for r in results)
    assert "mine" not in {v for r in results for v in r.metrics.values() if isinstance(v, str)}
    assert results.get_best_result().config == {"x": 1}


def test_bad_creator_and_function_checkpoint_options_fail_fit(local_client, storage_path):
    with pytest.raises(ValueError, match="trial_dirname_creator"):
        run(_named, storage_path, "bad-dir", param_space={"x": 1},
            tc=dict(trial_dirname_creator=lambda t: "../escape"))
    for option, value in (("checkpoint_frequency", 2), ("checkpoint_at_end", True)):
        with pytest.raises(ValueError, match=option):
            run(_named, storage_path, f"bad-{option}", param_space={"x": 1},
                checkpoint_config=tune.CheckpointConfig(**{option: value}))


def test_checkpoint_options_allowed_for_class_trainables():
    cc = tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True)
    tuner_build.check_checkpoint_config(tune.with_resources(_Counter, {"cpu": 1}), cc)
    tuner_build.check_checkpoint_config(_named, tune.CheckpointConfig(num_to_keep=1))
    with pytest.raises(ValueError, match="checkpoint_frequency"):
        tuner_build.check_checkpoint_config(tune.with_parameters(_named, data=1), cc)


# ------------------------------------------------------------------ 3/4. best result
def test_unknown_metric_raises_runtime_and_value_error():
    grid = ResultGrid([_trial("a", [1.0])], metric="loss", mode="min")
    for cls in (RuntimeError, ValueError):
        with pytest.raises(cls, match="'acc'.*reported keys"):
            grid.get_best_result(metric="acc", mode="max")


def test_nan_last_value_does_not_win_with_an_older_value():
    diverged, steady = _trial("a", [0.1, float("nan")]), _trial("b", [0.5])
    stats = diverged.metric_analysis["loss"]
    assert math.isnan(stats["last"]) and stats["min"] == 0.1 and stats["max"] == 0.1
    grid = ResultGrid([diverged, steady], metric="loss", mode="min")
    assert grid.get_best_result().config == {"id": "b"}
    # scope="all" is each trial's best ever: the diverged trial's 0.1 counts.
    assert grid.get_best_result(scope="all").config == {"id": "a"}
    # Unfiltered, Ray's comparison: NaN compares false, so the first trial seen stays.
    assert grid.get_best_result(filter_nan_and_inf=False).config == {"id": "a"}
    with pytest.raises(RuntimeError, match="NaN"):
        ResultGrid([_trial("c", [float("nan")])], metric="loss", mode="min").get_best_result()


# ------------------------------------------------------------------ 6/7. class API
class _Counter(tune.Trainable):
    def setup(self, config):
        self.n = 0

    def step(self):
        self.n += 1
        if self.n > 3:  # a bare done: Ray skips the metric check for it
            return {"done": True}
        return {"score": float(self.n)}

    def save_checkpoint(self, checkpoint_dir):
        return {"n": self.n}

    def load_checkpoint(self, checkpoint):
        self.n = checkpoint["n"]


def test_standalone_train_fills_ray_auto_fields():
    t = _Counter({"a": 1})
    first, second = t.train(), t.train()
    for key in ("training_iteration", "done", "time_this_iter_s", "time_total_s", "timestamp",
                "date", "iterations_since_restore", "time_since_restore", "trial_id", "pid",
                "hostname", "node_ip", "config"):
        assert key in first, key
    assert (first["training_iteration"], second["training_iteration"], t.iteration) == (1, 2, 2)
    assert first["done"] is False and first["config"] == {"a": 1}
    assert second["time_total_s"] >= first["time_total_s"] >= first["time_this_iter_s"] >= 0


def test_class_trainable_counts_once_and_bare_done_is_not_an_error(local_client, storage_path):
    results = run(_Counter, storage_path, "cls", tc=dict(metric="score", mode="max"))
    assert not results.errors, results.errors
    (r,) = results
    assert r.metrics_dataframe["training_iteration"].tolist() == [1, 2, 3, 4]
    assert r.metrics["done"] is True
    assert results.get_best_result().metrics_dataframe["score"].max() == 3.0


# ------------------------------------------------------------------ 8. context
def test_context_outside_a_trial_raises_runtime_error():
    ctx = tune.get_context()
    for method in (ctx.get_trial_dir, ctx.get_trial_id, ctx.get_trial_name):
        with pytest.raises(RuntimeError, match="inside a dasktune trial"):
            method()


# ------------------------------------------------------------------ 9. init
def test_local_cluster_takes_localcluster_arguments():
    from distributed import Client

    from tests.conftest import free_port

    port = free_port()
    cluster = runtime._local_cluster(2, processes=False, scheduler_port=port,
                                     dashboard_address=None, silence_logs=40,
                                     protocol="tcp://", threads_per_worker=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            assert client.scheduler.address == f"tcp://127.0.0.1:{port}"
            client.wait_for_workers(2, timeout=30)
            assert {w["resources"]["CPU"] for w in
                    client.scheduler_info()["workers"].values()} == {1.0}
            # processes=False: the workers are threads of this process
            assert set(client.run(os.getpid).values()) == {os.getpid()}
    finally:
        cluster.close()
    with pytest.raises(ValueError, match="inproc"):
        runtime._local_cluster(1, protocol="inproc")


def test_num_cpus_is_rays_logical_cpus_over_a_worker_per_core(monkeypatch):
    # Ray's ray.init(num_cpus=8) is one node of 8 CPUs, whatever the machine has: eight
    # 1-CPU trials at once, and room for a trial to grow. On two cores: two workers of 4.
    from dask import system

    monkeypatch.setattr(system, "CPU_COUNT", 2)
    cluster = runtime._local_cluster(8, processes=False, dashboard_address=None,
                                     silence_logs=40)
    try:
        from distributed import Client

        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=30)
            workers = client.scheduler_info()["workers"].values()
            assert sorted(w["resources"]["CPU"] for w in workers) == [4.0, 4.0]
            assert sorted(w["nthreads"] for w in workers) == [4, 4]
    finally:
        cluster.close()
    # Not more workers than CPUs; odd counts go to the first workers; no CPUs given: a
    # 1-CPU worker per core, as before.
    assert runtime._worker_cpus(3, None, None) == [2, 1]
    assert runtime._worker_cpus(1, None, None) == [1]
    assert runtime._worker_cpus(None, None, None) == [1, 1]
    assert runtime._worker_cpus(8, 3, None) == [3, 3, 2]
    assert runtime._worker_cpus(4, None, 2) == [2, 2]
    with pytest.raises(ValueError, match="cannot be split over n_workers=3"):
        runtime._worker_cpus(2, 3, None)
    with pytest.raises(ValueError, match="whole number"):
        runtime._worker_cpus(2.5, None, None)


def test_init_without_address_uses_the_configured_scheduler():
    from distributed import LocalCluster

    runtime.shutdown()
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        with dask.config.set({"scheduler-address": cluster.scheduler_address}):
            try:
                client = tune.init(configure_logging=False)  # a Ray-only argument: ignored
                assert client.scheduler.address == cluster.scheduler_address
                assert runtime._cluster is None  # dasktune started nothing of its own
                runtime.shutdown()
                with pytest.raises(TypeError, match="num_cpus"):
                    tune.init(num_cpus=2)
            finally:
                runtime.shutdown()


# ------------------------------------------------------------------ 10. inputs
def test_sequences_timedelta_mode_only_and_empty_metrics():
    assert tune.choice(np.array([1, 2])).categories == [1, 2]
    assert type(tune.choice(np.array([0.5])).categories[0]) is float
    assert tune.choice((1, 2)).categories == [1, 2]
    assert tune.grid_search(np.arange(3)) == {"grid_search": [0, 1, 2]}
    assert tune.grid_search(("a", "b")) == {"grid_search": ["a", "b"]}
    with pytest.raises(TypeError):
        tune.choice("ab")
    assert tune.TuneConfig(time_budget_s=datetime.timedelta(minutes=2)).time_budget_s == 120.0
    assert tune.TuneConfig(mode="max").metric is None
    r = result_from_trial(Trial("t", {"x": 1}), None)
    assert r.metrics == {} and r.config == {"x": 1}
