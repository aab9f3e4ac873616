"""dasktune on a real Grid Engine (``scripts/sge-local.sh``: Son of Grid Engine, Debian's
``gridengine``): ``up / status / submit / down`` with ``provider: sge`` and 40-second jobs
(``h_rt``), one trial longer than a job.

The worker learns its job's end from ``qstat -j JOB -xml`` and retires itself before it:
the trial moves to the replacement job with all its iterations, none run twice. Skipped
where Grid Engine cannot be started (not root, no apt); in CI (``CI=true``) it fails.
PBS and LSF have no such test: see docs/guides/clusters.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest
import yaml

from tests.conftest import read_jsonl, wait_for
from tests.test_slurm import DRIVER, ROOT

pytestmark = pytest.mark.slow
pytest.importorskip("dask_jobqueue")

ITERS = 70  # 0.5 s each (35 s): longer than the 25 s a 40-second job keeps its worker


def _sge_up() -> str | None:
    """None when a Grid Engine answers (started here if need be), else why not."""
    if shutil.which("qstat") and subprocess.run(["qstat"], capture_output=True,
                                                timeout=30).returncode == 0:
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Grid Engine is not running and starting it needs root and apt-get"
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "sge-local.sh")],
                         capture_output=True, text=True, timeout=600)
    return None if res.returncode == 0 else f"scripts/sge-local.sh failed: {res.stderr}"


@pytest.fixture(scope="module")
def sge() -> None:
    why = _sge_up()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Grid Engine test: {why}")
        pytest.skip(why)


def _queue(name: str) -> list[str]:
    """The ids of the cluster's jobs that Grid Engine still knows (queued or running)."""
    out = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True,
                         check=True).stdout
    return [ln.split()[0] for ln in out.splitlines()[2:] if ln.split()[2:3] == [name[:10]]]


def test_sge_up_status_submit_down_walltime_move(sge, tmp_path):
    name = f"dt-sge-{os.getpid()}"
    config = {
        "cluster_name": name, "provider": {"type": "sge"},
        "min_workers": 1, "max_workers": 2,  # room for the replacement job ahead
        "head_node_type": "head_node",
        "available_node_types": {"head_node": {"node_config": {}}, "worker_nodes": {
            "node_config": {"cores": 1, "memory": "1GB", "walltime": "00:00:40",
                            "interface": "lo",  # scheduler and workers on 127.0.0.1
                            # the job gets this environment (PYTHONPATH: this checkout)
                            "job_extra_directives": ["-V"]}}}}
    cluster_file = tmp_path / "sge.yaml"
    cluster_file.write_text(yaml.safe_dump(config))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           # 40-second jobs: retire 15 s before the end, replacement asked 10 s before that.
           "DASK_DASKTUNE__CLUSTER__WALLTIME__MARGIN": "15s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__REPLACE_AHEAD": "10s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__POLL_INTERVAL": "5s"}

    def dasktune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from dasktune.cli import main; main()",
                               *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=tmp_path)

    up = dasktune("up", str(cluster_file), "-y")
    clusters = tmp_path / "config" / "dasktune" / "clusters"
    state_file = clusters / f"{name}.json"
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads(state_file.read_text())
        head_pid = state["processes"][0]["pid"]
        assert state["scheduler_address"].startswith("tcp://127.0.0.1:")
        status = dasktune("status", str(cluster_file))
        assert status.returncode == 0, status.stderr
        assert "workers:   1" in status.stdout and "sge jobs:" in status.stdout
        assert "time left 00:00:" in status.stdout  # from qstat -j JOB -xml

        storage = tmp_path / "results"
        run = dasktune("submit", str(cluster_file), str(driver), "--", "--storage",
                       str(storage), "--iters", str(ITERS), "--trials", "1", "--sleep", "0.5",
                       timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        assert json.loads(line[len("RESULT "):]) == {"errors": [], "iterations": [ITERS]}
        (trial,) = storage.glob("exp/*/executed.jsonl")
        rows = read_jsonl(str(trial))
        # Every iteration ran exactly once, in more than one job: a graceful move.
        assert sorted(r["it"] for r in rows) == list(range(1, ITERS + 1))
        assert len({r["job"] for r in rows}) >= 2 and len({r["attempt"] for r in rows}) >= 2
        with open(trial.parent / "result.json") as f:
            assert [json.loads(x)["training_iteration"] for x in f] == \
                list(range(1, ITERS + 1))
        assert "Traceback" not in run.stderr
        logs = "".join(p.read_text(errors="replace") for p in (clusters / name / "jobs").glob("*"))
        assert "retiring gracefully" in logs and "reaches its time limit" in logs
        assert "ConnectionPool is closed" not in logs
    finally:
        down = dasktune("down", str(cluster_file), "-y")
    assert down.returncode == 0, down.stderr
    assert not state_file.exists()
    assert not psutil.pid_exists(head_pid) or \
        psutil.Process(head_pid).status() == psutil.STATUS_ZOMBIE
    wait_for(lambda: not _queue(name), timeout=60, interval=1.0,
             what="the cluster's jobs to leave qstat")
