"""The Tuner facade end to end on the embedded cluster: both trainable APIs, results,
checkpoints, stopping, files on disk, and every bad input the core issue names."""

from __future__ import annotations

import json
import os
import threading

import pytest

import dasktune as tune
from dasktune.trial import ERROR, TERMINATED


def quadratic(config):
    for i in range(config.get("iters", 5)):
        tune.report({"loss": (config["x"] - 1) ** 2 + 1.0 / (i + 1), "step": i})


def checkpointing(config):
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["i"] + 1
    for i in range(start, config["iters"]):
        d = os.path.join(tune.get_context().get_trial_dir(), f"tmp_ckpt_{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"i": i}, f)
        tune.report({"score": i * config["lr"]}, checkpoint=tune.Checkpoint.from_directory(d))


class Counter(tune.Trainable):
    def setup(self, config):
        self.count = 0
        self.lr = config["lr"]

    def step(self):
        self.count += 1
        return {"score": self.count * self.lr, "count": self.count}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "c.json"), "w") as f:
            json.dump({"count": self.count}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "c.json")) as f:
            self.count = json.load(f)["count"]


def run(trainable, storage_path, name="exp", param_space=None, **kw):
    tc = kw.pop("tune_config", None) or tune.TuneConfig(**kw.pop("tc", {}))
    rc = tune.RunConfig(name=name, storage_path=storage_path, verbose=0, **kw)
    return tune.Tuner(trainable, param_space=param_space or {}, tune_config=tc,
                      run_config=rc).fit()


def test_function_api_grid_and_random(local_client, storage_path):
    results = run(
        quadratic, storage_path,
        param_space={"x": tune.uniform(-2, 2), "iters": tune.grid_search([3, 5])},
        tc=dict(metric="loss", mode="min", num_samples=3, max_concurrent_trials=2),
    )
    assert len(results) == 6 and results.num_terminated == 6 and not results.errors
    iters = sorted(r.metrics["training_iteration"] for r in results)
    assert iters == [3, 3, 3, 5, 5, 5]
    best = results.get_best_result()
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in results)
    assert set(best.config) == {"x", "iters"}
    # trials ran inside the worker processes, not the driver
    worker_pids = set(local_client.run(os.getpid).values())
    assert {r.metrics["pid"] for r in results} <= worker_pids
    assert os.getpid() not in {r.metrics["pid"] for r in results}
    df = results.get_dataframe()
    assert "config/x" in df.columns and len(df) == 6
    assert results[0].metrics_dataframe["training_iteration"].tolist()[0] == 1


def test_auto_filled_fields_and_files(local_client, storage_path):
    results = run(quadratic, storage_path, param_space={"x": 0.5, "iters": 3})
    r = results[0]
    for key in ("training_iteration", "iterations_since_restore", "time_this_iter_s",
                "time_total_s", "timestamp", "date", "done", "trial_id", "pid", "hostname",
                "node_ip", "config"):
        assert key in r.metrics, key
    assert r.metrics["done"] is True and r.metrics["config"] == {"x": 0.5, "iters": 3}
    names = set(os.listdir(r.path))
    assert {"params.json", "params.pkl", "result.json", "progress.csv"} <= names
    assert any(n.startswith("events.out.tfevents.") for n in names)
    lines = open(os.path.join(r.path, "result.json")).read().splitlines()
    assert [json.loads(x)["training_iteration"] for x in lines] == [1, 2, 3]
    exp = os.path.join(storage_path, "exp")
    assert tune.Tuner.can_restore(exp)


def test_tensorboard_files_read_back(local_client, storage_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = run(quadratic, storage_path, param_space={"x": 0.0, "iters": 4})
    acc = EventAccumulator(results[0].path)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "ray/tune/loss" in tags and "ray/tune/step" in tags
    events = acc.Scalars("ray/tune/loss")
    assert [e.step for e in events] == [1, 2, 3, 4]
    assert events[-1].value == pytest.approx(1 + 0.25)


def test_class_api_checkpoints_and_retention(local_client, storage_path):
    results = run(
        Counter, storage_path, param_space={"lr": tune.grid_search([0.1, 1.0])},
        tc=dict(metric="score", mode="max"),
        stop={"training_iteration": 6},
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=2,
                                                checkpoint_at_end=True),
    )
    assert results.num_terminated == 2
    best = results.get_best_result()
    assert best.config["lr"] == 1.0 and best.metrics["score"] == 6.0
    assert best.metrics["training_iteration"] == 6
    ckpts = sorted(d for d in os.listdir(best.path) if d.startswith("checkpoint_"))
    assert len(ckpts) == 2  # num_to_keep
    with best.checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "c.json")))["count"] == 6
    assert len(best.best_checkpoints) == 2


def test_function_checkpoints_round_trip(local_client, storage_path):
    results = run(checkpointing, storage_path, param_space={"lr": 0.5, "iters": 4},
                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    r = results[0]
    assert r.metrics["training_iteration"] == 4
    assert r.checkpoint is not None and r.checkpoint.path.endswith("checkpoint_000003")
    out = r.checkpoint.to_directory()
    assert json.load(open(os.path.join(out, "state.json"))) == {"i": 3}
    assert [d for d in os.listdir(r.path) if d.startswith("checkpoint_")] == ["checkpoint_000003"]


def test_stop_callable_and_stopper(local_client, storage_path):
    results = run(quadratic, storage_path, param_space={"x": 0.0, "iters": 50},
                  stop=lambda trial_id, result: result["step"] >= 2)
    assert results[0].metrics["training_iteration"] == 3

    class AtFour(tune.Stopper):
        def __call__(self, trial_id, result):
            return result["training_iteration"] >= 4

    results = run(quadratic, storage_path, name="exp2", param_space={"x": 0.0, "iters": 50},
                  stop=AtFour())
    assert results[0].metrics["training_iteration"] == 4


def test_trial_error_is_recorded_and_others_finish(local_client, storage_path):
    def flaky(config):
        for i in range(3):
            if config["bad"] and i == 1:
                raise RuntimeError("boom in user code")
            tune.report({"v": i})

    results = run(flaky, storage_path, param_space={"bad": tune.grid_search([True, False])})
    assert results.num_errors == 1 and results.num_terminated == 1
    assert "boom in user code" in str(results.errors[0])
    bad = next(r for r in results if r.error is not None)
    assert "boom in user code" in open(os.path.join(bad.path, "error.txt")).read()


def test_max_failures_retries_user_errors(local_client, storage_path):
    def always_fails(config):
        tune.report({"v": 1})
        raise ValueError("third time is not the charm")

    results = run(always_fails, storage_path,
                  failure_config=tune.FailureConfig(max_failures=2))
    trial = results._trials[0]
    assert trial.status == ERROR and trial.num_failures == 3 and trial.attempt == 3


def test_fail_fast_raise(local_client, storage_path):
    def fails(config):
        raise KeyError("nope")

    with pytest.raises(tune.TuneError, match="nope"):
        run(fails, storage_path, failure_config=tune.FailureConfig(fail_fast="raise"))


def test_missing_metric_errors_naming_it(local_client, storage_path):
    results = run(quadratic, storage_path, param_space={"x": 0.0},
                  tc=dict(metric="accuracy", mode="max"))
    assert results.num_errors == 1
    assert "'accuracy'" in str(results.errors[0])


def test_missing_stop_key_errors_naming_it(local_client, storage_path):
    results = run(quadratic, storage_path, param_space={"x": 0.0}, stop={"epochs": 3})
    assert results.num_errors == 1 and "'epochs'" in str(results.errors[0])


def test_get_best_result_scopes_and_unknown_metric(local_client, storage_path):
    def curve(config):
        for v in config["values"]:
            tune.report({"m": v})

    results = run(curve, storage_path,
                  param_space={"values": tune.grid_search([[5, 1, 1], [3, 3, 3]])})
    assert results.get_best_result("m", "min", scope="last").metrics["m"] == 1
    assert results.get_best_result("m", "max", scope="all").config["values"] == [5, 1, 1]
    assert results.get_best_result("m", "max", scope="last").config["values"] == [3, 3, 3]
    with pytest.raises(ValueError, match="'nope'"):
        results.get_best_result("nope", "min")


def test_with_parameters_ships_data(local_client, storage_path):
    import numpy as np

    data = np.arange(100_000)

    def uses_data(config, data=None):
        tune.report({"total": int(data.sum()) * config["k"]})

    results = run(tune.with_parameters(uses_data, data=data), storage_path,
                  param_space={"k": tune.grid_search([1, 2])})
    assert sorted(r.metrics["total"] for r in results) == [int(data.sum()), 2 * int(data.sum())]


def test_context_and_resources(local_client, storage_path):
    def ctx(config):
        c = tune.get_context()
        tune.report({"id": c.get_trial_id(), "name": c.get_trial_name(),
                     "exp": c.get_experiment_name(), "cpu": c.get_trial_resources()["CPU"],
                     "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")})

    results = run(tune.with_resources(ctx, {"cpu": 1}), storage_path, name="ctxexp")
    m = results[0].metrics
    assert m["id"] == m["trial_id"] and m["exp"] == "ctxexp" and m["cpu"] == 1.0
    assert m["cuda"] == ""  # asked for no GPU: sees none


def test_time_budget_ends_experiment(local_client, storage_path):
    def forever(config):
        import time

        while True:
            time.sleep(0.05)
            tune.report({"v": 1})

    results = run(forever, storage_path, tc=dict(num_samples=-1, time_budget_s=2,
                                                max_concurrent_trials=2))
    assert len(results) >= 2 and results.num_errors == 0
    assert all(t.status == TERMINATED for t in results._trials[:2])


def test_callbacks_see_every_result_in_order(local_client, storage_path):
    seen = []
    lock = threading.Lock()

    class Recorder(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            with lock:
                seen.append((trial.trial_id, result["training_iteration"]))

        def on_trial_complete(self, iteration, trials, trial, **info):
            seen.append((trial.trial_id, "done"))

    run(quadratic, storage_path, param_space={"x": tune.grid_search([0, 1]), "iters": 20},
        callbacks=[Recorder()])
    for tid in {t for t, _ in seen}:
        mine = [i for t, i in seen if t == tid]
        assert mine == list(range(1, 21)) + ["done"]


def test_restore_finished_experiment_runs_nothing(local_client, storage_path):
    run(quadratic, storage_path, name="done_exp", param_space={"x": tune.grid_search([0, 1])})
    path = os.path.join(storage_path, "done_exp")
    tuner = tune.Tuner.restore(path, trainable=quadratic)
    grid = tuner.get_results()
    assert len(grid) == 2 and grid.num_terminated == 2
    again = tuner.fit()
    assert len(again) == 2
    for r in again:
        lines = open(os.path.join(r.path, "result.json")).read().splitlines()
        assert len(lines) == 5  # nothing ran twice


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make, match", [
    (lambda: tune.uniform(2, 1), "lower"),
    (lambda: tune.loguniform(0, 1), "0"),
    (lambda: tune.choice([]), "empty|at least one"),
])
def test_bad_domains(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_configs():
    with pytest.raises(ValueError, match="mode"):
        tune.TuneConfig(metric="loss", mode="minimize")
    with pytest.raises(ValueError, match="num_samples"):
        tune.TuneConfig(num_samples=0)
    with pytest.raises(TypeError, match="param_space|Mapping|mapping"):
        tune.Tuner(quadratic, param_space=[1, 2])
    with pytest.raises(TypeError, match="trainable"):
        tune.Tuner(42)


def test_unpicklable_trainable_names_culprit(storage_path):
    lock = threading.Lock()

    def uses_lock(config):
        with lock:
            tune.report({"v": 1})

    with pytest.raises(TypeError, match="lock"):
        tune.Tuner(uses_lock, run_config=tune.RunConfig(storage_path=storage_path)).fit()


def test_unwritable_storage_named(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a dir")
    with pytest.raises(ValueError, match=str(blocked)):
        tune.Tuner(quadratic, run_config=tune.RunConfig(storage_path=str(blocked))).fit()


def test_infinite_samples_need_budget(storage_path):
    with pytest.raises(ValueError, match="time_budget_s"):
        run(quadratic, storage_path, tc=dict(num_samples=-1))


def test_impossible_resources_fail_fast(local_client, storage_path):
    with pytest.raises(ValueError, match="GPU"):
        run(tune.with_resources(quadratic, {"gpu": 1}), storage_path,
            param_space={"x": 0.0})


def test_default_loggers_setting_and_rays_environment_variable(local_client, tmp_path,
                                                              monkeypatch):
    """``dasktune.default-loggers: false`` (or Ray's TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1,
    read at each run as in Ray) leaves out result.json/progress.csv; on by default."""
    import dask.config

    def names(grid):  # the trial folder is made by the first file written into it
        path = grid[0].path
        return set(os.listdir(path)) if os.path.isdir(path) else set()

    on = run(quadratic, str(tmp_path), name="on", param_space={"x": 1, "iters": 1})
    assert {"result.json", "progress.csv"} <= names(on)
    with dask.config.set({"dasktune.default-loggers": False}):
        off = run(quadratic, str(tmp_path), name="off", param_space={"x": 1, "iters": 1})
    assert not {"result.json", "progress.csv"} & names(off)
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    ray_off = run(quadratic, str(tmp_path), name="ray_off", param_space={"x": 1, "iters": 1})
    assert not {"result.json", "progress.csv"} & names(ray_off)
    assert ray_off[0].metrics["loss"] == 1.0  # the run itself is whole


# ------------------------------------------------------------------ Ray 2.60's small rules
def returns_a_number(config):
    tune.report({"step": 1})
    return config["x"] * 10


def returns_a_dict(config):
    return {"score": config["x"]}


def yields_numbers(config):
    for i in range(3):
        yield config["x"] + i


def returns_a_string(config):
    return "done"


def test_function_return_value_is_recorded_as_ray_does(local_client, storage_path):
    # Ray: a returned number is the metric "_metric"; a dict is the last result; a
    # generator's yields are results; a falsy return (0) is not reported.
    results = run(returns_a_number, storage_path, name="num",
                  param_space={"x": tune.grid_search([0, 2])})
    by_x = {r.config["x"]: r.metrics for r in results}
    assert by_x[2]["_metric"] == 20 and by_x[2]["training_iteration"] == 2
    assert "_metric" not in by_x[0] and by_x[0]["training_iteration"] == 1
    assert results.get_best_result("_metric", "max").config["x"] == 2
    assert run(returns_a_dict, storage_path, name="dict",
               param_space={"x": 3})[0].metrics["score"] == 3
    gen = run(yields_numbers, storage_path, name="gen", param_space={"x": 1})[0]
    assert gen.metrics["_metric"] == 3 and gen.metrics["training_iteration"] == 3
    assert gen.metrics_dataframe["_metric"].tolist() == [1, 2, 3]
    bad = run(returns_a_string, storage_path, name="bad", param_space={})
    assert "Invalid return or yield value" in str(bad[0].error)


def test_max_concurrent_trials_zero_means_no_limit(local_client, storage_path):
    assert tune.TuneConfig(max_concurrent_trials=0).max_concurrent_trials is None
    with pytest.raises(ValueError, match="max_concurrent_trials"):
        tune.TuneConfig(max_concurrent_trials=-1)
    results = run(quadratic, storage_path, param_space={"x": tune.grid_search([0, 1, 2])},
                  tc=dict(max_concurrent_trials=0))
    assert results.num_terminated == 3


def test_can_restore_once_constructed_with_a_path_or_a_filesystem(local_client, storage_path):
    import pathlib

    import fsspec

    exp = pathlib.Path(storage_path) / "early"
    assert not tune.Tuner.can_restore(exp)
    tune.Tuner(quadratic, param_space={"x": tune.grid_search([0, 1]), "iters": 2},
               run_config=tune.RunConfig(name="early", storage_path=storage_path, verbose=0))
    # Ray writes the Tuner's state at construction: restorable before fit() ran
    assert tune.Tuner.can_restore(exp) and tune.Tuner.can_restore(str(exp))
    assert tune.Tuner.can_restore(str(exp), storage_filesystem=fsspec.filesystem("file"))
    assert not tune.Tuner.can_restore(exp.parent / "nothing")
    # a Tuner that never ran restores to a fresh run of every trial
    results = tune.Tuner.restore(exp, quadratic).fit()
    assert sorted(r.config["x"] for r in results) == [0, 1] and results.num_terminated == 2


def test_pyarrow_filesystem_runs_and_restores(local_client, storage_path):
    # Ray takes a pyarrow filesystem: one that is not the local disk goes through fsspec's
    # ArrowFSWrapper (workers write through it); pyarrow's LocalFileSystem is the disk.
    pafs = pytest.importorskip("pyarrow.fs")
    import fsspec

    fs = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("file")))
    rc = tune.RunConfig(name="arrow", storage_path=storage_path, storage_filesystem=fs,
                        verbose=0)
    results = tune.Tuner(checkpointing, param_space={"lr": 1.0, "iters": 3},
                         run_config=rc).fit()
    assert results[0].metrics["score"] == 2.0
    with results[0].checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "state.json")))["i"] == 2
    exp = os.path.join(storage_path, "arrow")
    assert os.path.exists(os.path.join(exp, "experiment_state.json"))
    assert tune.Tuner.can_restore(exp, storage_filesystem=fs)
    assert tune.Tuner.can_restore(exp, storage_filesystem=pafs.LocalFileSystem())
    again = tune.Tuner.restore(exp, checkpointing, storage_filesystem=fs).fit()
    assert again.num_terminated == 1 and again[0].metrics["score"] == 2.0
    with pytest.raises(TypeError, match="storage_filesystem must be an fsspec filesystem or"):
        tune.Tuner(checkpointing, run_config=tune.RunConfig(storage_path=storage_path,
                                                            storage_filesystem=object()))


def other_trainable(config):
    tune.report({"loss": 0.0})


def test_restore_refuses_another_trainable_or_new_param_keys(storage_path):
    space = {"x": tune.uniform(0, 1), "model": {"depth": tune.choice([1, 2])}, "iters": 2}
    tune.Tuner(quadratic, param_space=space,
               run_config=tune.RunConfig(name="orig", storage_path=storage_path))
    exp = os.path.join(storage_path, "orig")
    with pytest.raises(ValueError, match="Invalid `trainable`.*'other_trainable'.*'quadratic'"):
        tune.Tuner.restore(exp, other_trainable)
    new_key = {**space, "model": {"depth": tune.choice([1, 2]), "width": 3}}
    with pytest.raises(ValueError, match=r"Invalid `param_space`(.|\n)*model/width"):
        tune.Tuner.restore(exp, quadratic, param_space=new_key)
    # the same keys with refreshed values are fine (what re-specifying is for)
    tune.Tuner.restore(exp, quadratic, param_space={**space, "iters": 3})


class CountingStopper(tune.Stopper):
    """Stops the experiment after ``limit`` results in all: state a restore must keep."""

    def __init__(self, limit):
        self.limit, self.seen = limit, 0

    def __call__(self, trial_id, result):
        self.seen += 1
        return False

    def stop_all(self):
        return self.seen >= self.limit


def fails_once(config):
    import time

    for i in range(1, 41):
        time.sleep(0.02)
        if i == 16 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("first run fails")
        tune.report({"i": i})


def test_stopper_state_is_saved_and_restored(local_client, storage_path, tmp_path):
    # Ray saves the stopper with the experiment: after a restore it goes on from where it
    # was (a TimeoutStopper with the budget it had left), not from scratch.
    rc = tune.RunConfig(name="stopper", storage_path=storage_path, verbose=0,
                        stop=CountingStopper(20))
    first = tune.Tuner(fails_once, param_space={"marker": str(tmp_path / "m")},
                       run_config=rc).fit()
    assert first[0].error is not None and first[0].metrics["i"] == 15
    exp = os.path.join(storage_path, "stopper")
    second = tune.Tuner.restore(exp, fails_once, restart_errored=True).fit()
    # 15 results were counted before: the limit of 20 comes after about 5 more
    assert second[0].error is None and second[0].metrics["i"] < 15


def test_timeout_stopper_goes_on_with_the_budget_left():
    import pickle
    import time

    stopper = tune.stopper.TimeoutStopper(60)
    assert not stopper.stop_all()  # the clock starts at the first check
    time.sleep(0.3)
    assert not stopper.stop_all()
    left = stopper._budget
    assert 59.0 < left <= 59.7
    blob = pickle.dumps(stopper)
    time.sleep(0.3)  # the time the experiment was down is not counted
    restored = pickle.loads(blob)
    assert not restored.stop_all()
    assert restored._budget == left
    assert tune.stopper.TimeoutStopper(0.0).stop_all()
    with pytest.raises(ValueError, match="timeout"):
        tune.stopper.TimeoutStopper("10s")
