"""``serve_static``: the page and JSON for a finished experiment read from storage."""

from __future__ import annotations

import json
import time

import fsspec
import pytest
import requests

from dasktune.dashboard import load_experiment, serve_static
from dasktune.trial import Placement, Trial

pytestmark = pytest.mark.timeout(60)

SECRET = "hunter2-do-not-show"


def write_experiment(fs: fsspec.AbstractFileSystem, root: str, n_trials: int = 3,
                     n_iters: int = 5) -> list[Trial]:
    """A small finished experiment in the layout the storage module writes."""
    t0 = time.time() - 100
    trials = []
    for i in range(n_trials):
        trial = Trial(f"{i:05d}", {"lr": 0.1 * (i + 1), "password": SECRET},
                      experiment_tag=f"lr={0.1 * (i + 1):.1f}")
        trial.set_status("RUNNING")
        trial.placements.append(Placement(1, "tcp://10.0.0.1:4000", "node-1", t0 + i))
        lines = []
        for it in range(1, n_iters + 1):
            result = {"training_iteration": it, "loss": (i + 1) / it, "timestamp": t0 + i + it,
                      "trial_id": trial.trial_id}
            trial.update_last_result(result)
            lines.append(json.dumps(result))
        lines.append('{"training_iteration": 99, "lo')  # a writer killed mid-line
        trial.placements[-1].end, trial.placements[-1].outcome = t0 + i + n_iters, "done"
        trial.set_status("TERMINATED")
        fs.makedirs(f"{root}/{trial.dirname}", exist_ok=True)
        fs.pipe_file(f"{root}/{trial.dirname}/result.json", "\n".join(lines).encode())
        trials.append(trial)
    state = {"name": "fixture-exp", "trials": [t.to_state() for t in trials], "metric": "loss",
             "mode": "min", "searcher": "BasicVariantGenerator", "scheduler": "ASHAScheduler",
             "start_time": t0, "storage": f"s3://AKIA:{SECRET}@bucket/results"}
    fs.pipe_file(f"{root}/experiment_state.json", json.dumps(state).encode())
    return trials


def test_serves_page_and_json_for_stored_experiment(tmp_path):
    root = str(tmp_path / "fixture-exp")
    trials = write_experiment(fsspec.filesystem("file"), root)
    server, url = serve_static(root)
    with server:
        assert url == f"http://127.0.0.1:{server.port}/dasktune"
        page = requests.get(url, timeout=10)
        assert page.status_code == 200 and "bokeh-tables" in page.text
        assert requests.get(url.replace("/dasktune", "/statics/css/base.css"),
                            timeout=10).status_code == 200
        experiments = requests.get(url + "/api/experiments", timeout=10).json()["experiments"]
        assert len(experiments) == 1
        summary = experiments[0]
        assert summary["name"] == "fixture-exp" and summary["status"] == "FINISHED"
        assert summary["storage"] == "s3://bucket/results"
        assert summary["trials_by_status"] == {"TERMINATED": 3}
        assert summary["best_trial_id"] == "00000"
        body = requests.get(url + "/api/trials", params={"points": "1"}, timeout=10).json()
        records = {r["trial_id"]: r for r in body["trials"]}
        for trial in trials:
            record = records[trial.trial_id]
            assert record["status"] == "TERMINATED" and record["iteration"] == 5
            assert record["best"] == pytest.approx(trial.metric_analysis["loss"]["min"])
            assert [p[0] for p in record["points"]] == [1, 2, 3, 4, 5]
            assert record["host"] == "node-1" and record["config"]["password"] == "***"
        assert SECRET not in json.dumps([experiments, body])
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=2)


def test_reads_through_fsspec_uri():
    fs = fsspec.filesystem("memory")
    write_experiment(fs, "/dashboard-test/exp", n_trials=2, n_iters=3)
    state = load_experiment("memory://dashboard-test/exp")
    (summary,) = state.experiments()
    assert summary["num_trials"] == 2
    assert len(state.snapshot("fixture-exp").best_so_far) >= 1


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="not a dasktune experiment folder"):
        serve_static(str(tmp_path))
    (tmp_path / "experiment_state.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_experiment(str(tmp_path))
    (tmp_path / "experiment_state.json").write_text("{}")
    with pytest.raises(ValueError, match="no 'trials' list"):
        load_experiment(str(tmp_path))
    with pytest.raises(TypeError, match="non-empty str"):
        load_experiment(None)
    with pytest.raises(ValueError, match="port"):
        serve_static(str(tmp_path), port=-1)


def test_cli_dashboard_serves_a_results_folder(tmp_path):
    """``dasktune dashboard PATH`` (a separate process) serves every experiment under PATH."""
    import os
    import re
    import subprocess
    import sys

    from conftest import free_port, wait_for

    fs = fsspec.filesystem("file")
    write_experiment(fs, str(tmp_path / "exp-a"), n_trials=2)
    write_experiment(fs, str(tmp_path / "exp-b"), n_trials=3)
    port = free_port()
    log = tmp_path / "cli.log"
    exe = os.path.join(os.path.dirname(sys.executable), "dasktune")
    with open(log, "w") as out:
        proc = subprocess.Popen([exe, "dashboard", str(tmp_path), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "serving" in log.read_text() or proc.poll() is not None,
                 timeout=30, what="the dashboard command to start serving")
        assert proc.poll() is None, log.read_text()
        url = re.search(r"(http://\S+/dasktune)", log.read_text()).group(1)
        assert url == f"http://127.0.0.1:{port}/dasktune"
        assert "bokeh" in requests.get(url, timeout=10).text
        experiments = requests.get(url + "/api/experiments", timeout=10).json()["experiments"]
        assert len(experiments) == 2
        counts = sorted(len(requests.get(url + "/api/trials", params={"experiment": e[
            "experiment_id"]}, timeout=10).json()["trials"]) for e in experiments)
        assert counts == [2, 3]  # two experiments of one name stay apart
    finally:
        proc.kill()
        proc.wait(10)


def test_cli_dashboard_names_a_missing_folder(tmp_path):
    import os
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "dasktune")
    out = subprocess.run([exe, "dashboard", str(tmp_path / "nope")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.startswith("error: ") and "nope" in out.stderr
    assert "Traceback" not in out.stderr
