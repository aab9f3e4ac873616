"""The dashboard fed by a real Tuner: its JSON matches the ResultGrid after fit()."""

from __future__ import annotations

import pytest
import requests
from conftest import wait_for

import dasktune as tune


def _curve(config):
    for i in range(4):
        tune.report({"loss": config["x"] + 1.0 / (i + 1)})


def test_json_endpoint_matches_result_grid(local_client, storage_path):
    results = tune.Tuner(
        _curve, param_space={"x": tune.grid_search([0.0, 1.0, 2.0])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="dash-e2e", storage_path=storage_path, verbose=0),
    ).fit()
    base = local_client.dashboard_link.split("/status")[0]

    def experiment():
        exps = requests.get(f"{base}/dasktune/api/experiments", timeout=5).json()["experiments"]
        mine = [e for e in exps if e.get("name") == "dash-e2e"]
        return mine[0] if mine else None

    exp = wait_for(experiment, timeout=15, what="the experiment on the dashboard")
    eid = exp["experiment_id"]

    def trials():
        got = requests.get(f"{base}/dasktune/api/trials", params={"experiment": eid},
                           timeout=5).json()["trials"]
        done = [t for t in got if t["status"] == "TERMINATED"]
        return got if len(done) == len(results) else None

    got = {t["trial_id"]: t for t in wait_for(trials, timeout=15, what="final trial states")}
    for r in results:
        t = got[r.metrics["trial_id"]]
        assert t["iteration"] == r.metrics["training_iteration"] == 4
        assert t["last"] == pytest.approx(r.metrics["loss"])
        assert t["config"]["x"] == r.config["x"]
    best = results.get_best_result()
    assert min(got.values(), key=lambda t: t["best"])["trial_id"] == best.metrics["trial_id"]
    # The updates went to the plugin, not into the scheduler's event log as well.
    assert not [m for _, m in local_client.get_events("dasktune")
                if m.get("experiment_id") == eid]
