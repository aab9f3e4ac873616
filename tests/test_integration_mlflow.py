"""MLflow: ``MLflowLoggerCallback`` and ``setup_mlflow`` against real tracking stores.

A real ``mlflow server`` process (a ``sqlite:///`` backend store, artifacts served
from a folder), started on a free loopback port for this module and killed by its
process group at the end. What the tests check is what
MLflow's own client reads back: runs, parameters, metric histories, artifacts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

import dasktune as tune
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.slow
mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from dasktune.integration.mlflow import MLflowLoggerCallback  # noqa: E402


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, timeout=120, interval=0.5, what="mlflow server")
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def train(config):
    for step in range(config["steps"]):
        tune.report({"loss": config["x"] / (step + 1), "nested": {"acc": step * 0.1}})
    if config.get("fail"):
        raise RuntimeError("this trial fails")


def _runs(client: MlflowClient, experiment: str) -> dict[str, object]:
    """The experiment's runs by the trial ID in their name (``trial_<id>_<tag>``)."""
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = {}
    for run in client.search_runs([exp.experiment_id], max_results=100):
        name = run.data.tags["mlflow.runName"]
        assert name.startswith("trial_"), name
        trial_id = "_".join(name.split("_")[1:3])  # <experiment hash>_<5-digit index>
        assert trial_id not in runs, f"two runs for trial {trial_id}"
        runs[trial_id] = run
    return runs


def test_logger_callback_logs_runs_metrics_and_artifacts_to_a_server(
        local_client, storage_path, mlflow_server):
    grid = tune.Tuner(
        train, param_space={"x": tune.grid_search([1.0, 2.0]), "steps": 3,
                            "fail": tune.grid_search([False, True])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            storage_path=storage_path, name="mlf",
            callbacks=[MLflowLoggerCallback(tracking_uri=mlflow_server,
                                            experiment_name="cb-exp", tags={"team": "a"},
                                            save_artifact=True)]),
    ).fit()
    assert len(grid) == 4 and grid.num_errors == 2
    client = MlflowClient(tracking_uri=mlflow_server)
    runs = _runs(client, "cb-exp")
    assert sorted(runs) == sorted(r.metrics["trial_id"] for r in grid)
    for result in grid:
        config = result.config
        run = runs[result.metrics["trial_id"]]
        assert run.data.tags["team"] == "a"
        assert run.data.tags["trial_name"] == run.data.tags["mlflow.runName"]
        assert run.info.status == ("FAILED" if config["fail"] else "FINISHED")
        assert run.data.params == {"x": str(config["x"]), "steps": "3",
                                   "fail": str(config["fail"])}
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
            [(s + 1, config["x"] / (s + 1)) for s in range(3)]
        assert [m.value for m in client.get_metric_history(run.info.run_id, "nested/acc")] \
            == pytest.approx([0.0, 0.1, 0.2])
        assert "date" not in run.data.metrics and "config/x" not in run.data.metrics
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"result.json", "progress.csv", "params.json"} <= names, names
        local = client.download_artifacts(run.info.run_id, "result.json", str(storage_path))
        assert len(open(local).read().splitlines()) == 3  # every line, uploaded after close


def train_with_setup(config):
    from dasktune.integration.mlflow import setup_mlflow

    mlf = setup_mlflow(config, tags={"how": "setup"})
    for step in range(3):
        mlf.log_metric("own", config["x"] * step, step=step)
        tune.report({"loss": config["x"]})


def test_setup_mlflow_in_trials_logs_to_the_server(local_client, storage_path, mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server)
    client.create_experiment("setup-exp")
    space = {"x": tune.grid_search([1, 2]),
             "mlflow": {"tracking_uri": mlflow_server, "experiment_name": "setup-exp"}}
    grid = tune.Tuner(train_with_setup, param_space=space,
                      run_config=tune.RunConfig(storage_path=storage_path, name="setup")).fit()
    assert grid.num_errors == 0
    runs = _runs(client, "setup-exp")
    assert sorted(runs) == sorted(r.metrics["trial_id"] for r in grid)
    for result in grid:
        run = runs[result.metrics["trial_id"]]
        assert run.info.status == "FINISHED"  # ended with the trial, not the worker
        assert run.data.tags["how"] == "setup"
        assert run.data.params == {"x": str(result.config["x"])}  # not the mlflow settings
        assert [m.value for m in sorted(client.get_metric_history(run.info.run_id, "own"),
                                        key=lambda m: m.step)] == \
            [result.config["x"] * s for s in range(3)]


def test_setup_mlflow_without_an_experiment_creates_the_tune_one(
        local_client, storage_path, mlflow_server):
    grid = tune.Tuner(train_with_setup, param_space={"x": 3, "mlflow": {
        "tracking_uri": mlflow_server}},
        run_config=tune.RunConfig(storage_path=storage_path, name="fresh-name")).fit()
    assert grid.num_errors == 0
    runs = _runs(MlflowClient(tracking_uri=mlflow_server), "fresh-name")
    assert list(runs) == [grid[0].metrics["trial_id"]]


def test_setup_mlflow_named_experiment_missing_is_an_error(local_client, storage_path,
                                                          mlflow_server):
    grid = tune.Tuner(train_with_setup, param_space={"x": 1, "mlflow": {
        "tracking_uri": mlflow_server, "experiment_name": "nobody-made-this"}},
        run_config=tune.RunConfig(storage_path=storage_path, name="missing")).fit()
    assert grid.num_errors == 1
    assert "'nobody-made-this' does not exist" in str(grid[0].error)


def test_logger_callback_without_an_experiment_uses_the_tune_one(
        local_client, storage_path, mlflow_server):
    tune.Tuner(train, param_space={"x": 1.0, "steps": 2},
               run_config=tune.RunConfig(storage_path=storage_path, name="tune-named",
                                         callbacks=[MLflowLoggerCallback(mlflow_server)])).fit()
    (run,) = _runs(MlflowClient(tracking_uri=mlflow_server), "tune-named").values()
    assert run.info.status == "FINISHED" and run.data.metrics["loss"] == 0.5


def test_logger_callback_with_an_unreachable_store_fails_before_any_trial(
        local_client, storage_path):
    ran = []
    with pytest.raises(ConnectionError, match="is not reachable"):
        tune.Tuner(lambda config: ran.append(1), run_config=tune.RunConfig(
            storage_path=storage_path, name="nowhere", callbacks=[MLflowLoggerCallback(
                f"http://127.0.0.1:{free_port()}")])).fit()
    assert not ran
