"""The live page on a real Dask cluster: plugin, callback, JSON endpoints, navigation."""

from __future__ import annotations

import json
import logging
import time

import pytest
import requests
from distributed import Client, LocalCluster

from dasktune.dashboard import DashboardCallback, DasktuneDashboardPlugin, register_dashboard
from dasktune.dashboard._plugin import PLUGIN_NAME
from dasktune.trial import Placement, Trial

pytestmark = pytest.mark.timeout(60)

SECRET = "hunter2-do-not-show"


@pytest.fixture(scope="module")
def cluster():
    # tcp on 127.0.0.1 so that client.dashboard_link names the address the page listens on.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster:
        yield cluster


@pytest.fixture
def client(cluster):
    with Client(cluster) as client:
        yield client


def _get(url: str, **params):
    return requests.get(url, params=params, timeout=10)


def _run_trials(cb: DashboardCallback, workers: list[str], n_trials: int, n_iters: int):
    """Drive real Trial objects through the callback's hooks like the controller does."""
    trials = [Trial(f"t{i}", {"lr": 10.0 ** -i, "api_key": SECRET,
                              "data": f"s3://AKIA:{SECRET}@bucket/data"})
              for i in range(n_trials)]
    cb.setup(total_num_samples=n_trials)
    for i, trial in enumerate(trials):
        trial.set_status("RUNNING")
        trial.placements.append(Placement(1, workers[i % len(workers)], "127.0.0.1",
                                          time.time()))
        cb.on_trial_start(0, trials, trial)
    for it in range(1, n_iters + 1):
        for i, trial in enumerate(trials):
            result = {"training_iteration": it, "loss": (i + 1) / it}
            trial.update_last_result(result)
            cb.on_trial_result(it, trials, trial, result)
        cb.on_step_end(it, trials)
    for trial in trials:
        trial.placements[-1].end, trial.placements[-1].outcome = time.time(), "done"
        trial.set_status("TERMINATED")
        cb.on_trial_complete(n_iters, trials, trial)
    cb.on_experiment_end(trials)
    return trials


def test_register_is_idempotent_and_links_navigation(cluster, client):
    url = register_dashboard(client)
    assert url == client.dashboard_link.rsplit("/", 1)[0] + "/dasktune"
    plugin = cluster.scheduler.plugins[PLUGIN_NAME]
    assert register_dashboard(client) == url
    assert cluster.scheduler.plugins[PLUGIN_NAME] is plugin
    page = _get(url)
    assert page.status_code == 200 and "bokeh-tables" in page.text  # content: websocket
    status_page = _get(client.dashboard_link).text
    assert status_page.count('href="dasktune"') == 1


def test_json_endpoints_match_trials_and_hide_secrets(cluster, client):
    url = register_dashboard(client)
    workers = list(client.scheduler_info()["workers"])
    cb = DashboardCallback(client, {
        "name": "exp-a", "metric": "loss", "mode": "min", "searcher": "BasicVariantGenerator",
        "scheduler": "FIFOScheduler", "storage": f"s3://key:{SECRET}@bucket/results/exp-a"})
    trials = _run_trials(cb, workers, n_trials=3, n_iters=4)
    other = DashboardCallback(client, {"name": "exp-b", "metric": "acc", "mode": "max"})
    _run_trials(other, workers, n_trials=1, n_iters=2)

    experiments = _get(url + "/api/experiments").json()["experiments"]
    by_id = {e["experiment_id"]: e for e in experiments}
    assert {cb.experiment_id, other.experiment_id} <= set(by_id)
    summary = by_id[cb.experiment_id]
    assert summary["name"] == "exp-a" and summary["status"] == "FINISHED"
    assert summary["storage"] == "s3://bucket/results/exp-a"
    assert summary["trials_by_status"] == {"TERMINATED": 3}
    assert summary["best_trial_id"] == "t0" and summary["best_value"] == pytest.approx(0.25)

    body = _get(url + "/api/trials", experiment=cb.experiment_id, points=1).json()
    records = {r["trial_id"]: r for r in body["trials"]}
    assert set(records) == {t.trial_id for t in trials}
    for trial in trials:
        record = records[trial.trial_id]
        assert record["status"] == trial.status == "TERMINATED"
        assert record["iteration"] == trial.last_result["training_iteration"] == 4
        assert record["last"] == pytest.approx(trial.last_result["loss"])
        assert record["best"] == pytest.approx(trial.metric_analysis["loss"]["min"])
        assert record["worker"] == trial.placements[-1].worker
        assert record["config"]["lr"] == trial.config["lr"]
        assert record["config"]["api_key"] == "***"
        assert [p[0] for p in record["points"]] == [1, 2, 3, 4]
        assert record["placements"][0]["outcome"] == "done"

    # Nothing secret on the page's endpoints, nor in the scheduler's event log.
    everything = json.dumps([experiments, body, client.get_events("dasktune")], default=str)
    assert SECRET not in everything and "AKIA" not in everything


def test_trials_endpoint_errors(client):
    url = register_dashboard(client)
    for name in ("x", "y"):  # two experiments: the id becomes required
        DashboardCallback(client, {"name": name}).setup()
    missing = _get(url + "/api/trials")
    assert missing.status_code == 400 and "experiment=" in missing.json()["error"]
    unknown = _get(url + "/api/trials", experiment="nope")
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]


def _trial_ids(url: str, experiment_id: str) -> list[str]:
    body = _get(url + "/api/trials", experiment=experiment_id).json()
    return sorted(t["trial_id"] for t in body.get("trials", []))


def test_updates_are_batched_and_bypass_the_event_log(client):
    url = register_dashboard(client)
    logged = len(client.get_events("dasktune"))
    cb = DashboardCallback(client, {"name": "batched", "metric": "loss", "mode": "min"},
                           flush_interval=3600)
    trial = Trial("b0", {})
    cb.setup()  # first flush: the experiment summary
    trial.set_status("RUNNING")
    cb.on_trial_start(0, [trial], trial)
    for it in range(1, 50):
        result = {"training_iteration": it, "loss": 1.0 / it}
        trial.update_last_result(result)
        cb.on_trial_result(it, [trial], trial, result)
        cb.on_step_end(it, [trial])
    assert _trial_ids(url, cb.experiment_id) == []  # not due yet
    trial.set_status("TERMINATED")
    cb.on_experiment_end([trial])
    body = _get(url + "/api/trials", experiment=cb.experiment_id, points=1).json()
    (record,) = body["trials"]
    assert record["status"] == "TERMINATED" and len(record["points"]) == 49
    # The plugin's handler took them: the scheduler's event log keeps no second copy.
    assert len(client.get_events("dasktune")) == logged


def test_replugged_dashboard_keeps_its_experiments(cluster, client):
    url = register_dashboard(client)
    workers = list(client.scheduler_info()["workers"])
    cb = DashboardCallback(client, {"name": "replugged", "metric": "loss", "mode": "min"})
    _run_trials(cb, workers, n_trials=2, n_iters=2)
    old = cluster.scheduler.plugins[PLUGIN_NAME]
    client.unregister_scheduler_plugin(PLUGIN_NAME)
    assert register_dashboard(client) == url
    assert cluster.scheduler.plugins[PLUGIN_NAME] is not old
    mounted = [a for a in cluster.scheduler.http_application.applications
               if getattr(a, "_dasktune_dashboard", False)]
    assert len(mounted) == 1
    assert _get(client.dashboard_link).text.count('href="dasktune"') == 1
    assert _trial_ids(url, cb.experiment_id) == ["t0", "t1"]
    later = DashboardCallback(client, {"name": "after", "metric": "loss", "mode": "min"})
    _run_trials(later, workers, n_trials=1, n_iters=2)
    assert _trial_ids(url, later.experiment_id) == ["t0"]


def test_a_late_dashboard_replays_what_the_event_log_kept():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        # No plugin yet: the updates wait in the scheduler's event log.
        early = DashboardCallback(client, {"name": "early", "metric": "loss", "mode": "min"})
        _run_trials(early, workers, n_trials=2, n_iters=3)
        assert {m["type"] for _, m in client.get_events("dasktune")} == \
            {"experiment", "trials", "results"}
        url = register_dashboard(client)
        assert _trial_ids(url, early.experiment_id) == ["t0", "t1"]

        # A plugin that closes (scheduler shutdown, or a user's own close) hands its
        # handler back to the event log, so a driver still sending loses nothing.
        cb = DashboardCallback(client, {"name": "orphan", "metric": "loss", "mode": "min"})
        cb.setup()
        client.sync(cluster.scheduler.plugins[PLUGIN_NAME].close)
        client.unregister_scheduler_plugin(PLUGIN_NAME)
        logged = len(client.get_events("dasktune"))
        _run_trials(cb, workers, n_trials=1, n_iters=2)
        assert len(client.get_events("dasktune")) > logged
        url = register_dashboard(client)
        assert _trial_ids(url, cb.experiment_id) == ["t0"]


def test_send_failures_never_reach_the_tuning_loop(cluster, caplog):
    with Client(cluster) as client:
        cb = DashboardCallback(client, {"name": "gone"})
    trial = Trial("g0", {})
    with caplog.at_level(logging.WARNING, logger="dasktune.dashboard._callback"):
        cb.on_trial_start(0, [trial], trial)
        cb.on_experiment_end([trial])
    assert "could not send updates" in caplog.text


def test_bad_arguments(client):
    with pytest.raises(TypeError, match="distributed.Client"):
        DashboardCallback(object(), {})
    with pytest.raises(TypeError, match="experiment_info must be a dict"):
        DashboardCallback(client, ["name"])
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        DashboardCallback(client, {"metric": "loss", "mode": "avg"})
    with pytest.raises(TypeError, match="metric must be a str"):
        DashboardCallback(client, {"metric": 3})
    with pytest.raises(ValueError, match="flush_interval"):
        DashboardCallback(client, {}, flush_interval=-1)
    with pytest.raises(TypeError, match="distributed.Client"):
        register_dashboard("http://scheduler:8787")
    with pytest.raises(ValueError, match="max_points"):
        DasktuneDashboardPlugin(max_points=0)
