"""dasktune on a real Slurm (``scripts/slurm-local.sh``): ``up / status / submit / down`` on
cluster/slurm.yaml with 1-minute jobs, and an experiment longer than any job.

Without ``--lifetime``, every worker retires itself before its job's time limit and its
trials move there gracefully: each trial ends with all its iterations, none run twice.
Skipped where Slurm cannot be started (not root, no apt); in CI (``CI=true``) it fails.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import psutil
import pytest
import yaml

from tests.conftest import wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("dask_jobqueue")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS = 120  # 1 s each: every trial outlives two or three 1-minute jobs

DRIVER = textwrap.dedent("""
    import argparse, json, os, time
    import dasktune as tune

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()

    class Counter(tune.Trainable):
        def setup(self, config):
            self.i = 0
            ctx = tune.get_context()
            self.dir, self.attempt = ctx.get_trial_dir(), ctx.get_attempt()

        def step(self):
            time.sleep(1.0)
            self.i += 1
            with open(os.path.join(self.dir, "executed.jsonl"), "a") as f:
                f.write(json.dumps({"attempt": self.attempt, "it": self.i}) + "\\n")
            return {"i": self.i}

        def save_checkpoint(self, d):
            with open(os.path.join(d, "s.json"), "w") as f:
                json.dump({"i": self.i}, f)

        def load_checkpoint(self, d):
            with open(os.path.join(d, "s.json")) as f:
                self.i = json.load(f)["i"]

    tune.init(address=args.address)
    grid = tune.Tuner(
        Counter, param_space={"x": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(storage_path=args.storage, name="exp", verbose=0,
                                  stop={"training_iteration": args.iters}),
    ).fit()
    print("RESULT", json.dumps({"errors": [str(r.error) for r in grid if r.error],
                                "iterations": [r.metrics["training_iteration"] for r in grid]}))
""")


def _slurm_up() -> str | None:
    """None when a Slurm answers (started here if need be), else why not."""
    if shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True,
                                                timeout=30).returncode == 0:
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not running and starting it needs root and apt-get"
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "slurm-local.sh")],
                         capture_output=True, text=True, timeout=600)
    return None if res.returncode == 0 else f"scripts/slurm-local.sh failed: {res.stderr}"


@pytest.fixture(scope="module")
def slurm() -> None:
    why = _slurm_up()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm tests: {why}")
        pytest.skip(why)


def _queue(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def test_up_status_submit_down_walltime_moves(slurm, tmp_path):
    with open(os.path.join(ROOT, "cluster", "slurm.yaml")) as f:
        data = yaml.safe_load(f)
    name = f"dt-test-{os.getpid()}"
    data["cluster_name"] = name
    data["provider"].pop("partition", None)  # the default partition of whatever Slurm
    data["available_node_types"]["worker_nodes"]["node_config"]["walltime"] = "00:01:00"
    cluster_file = tmp_path / "slurm.yaml"
    cluster_file.write_text(yaml.safe_dump(data))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           # 1-minute jobs: retire 20 s before the end, replacement asked 15 s before that.
           "DASK_DASKTUNE__CLUSTER__WALLTIME__MARGIN": "20s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__REPLACE_AHEAD": "15s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__POLL_INTERVAL": "5s"}

    def dasktune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from dasktune.cli import main; main()",
                               *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=tmp_path)

    up = dasktune("up", str(cluster_file), "-y")
    state_file = tmp_path / "config" / "dasktune" / "clusters" / f"{name}.json"
    try:
        assert up.returncode == 0, up.stderr
        head_pid = json.loads(state_file.read_text())["processes"][0]["pid"]
        status = dasktune("status", str(cluster_file))
        assert status.returncode == 0, status.stderr
        assert "workers:   2" in status.stdout and "slurm jobs:" in status.stdout
        assert "running" in status.stdout and "time left 00:00:" in status.stdout

        storage = tmp_path / "results"
        run = dasktune("submit", str(cluster_file), str(driver), "--", "--storage",
                       str(storage), "--iters", str(ITERS), timeout=400)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        result = json.loads(line[len("RESULT "):])
        assert result == {"errors": [], "iterations": [ITERS, ITERS]}
        trials = glob.glob(str(storage / "exp" / "*" / "executed.jsonl"))
        assert len(trials) == 2
        for trial in trials:
            rows = [json.loads(x) for x in open(trial).read().splitlines()]
            # Every iteration ran exactly once, across more than one job.
            assert sorted(r["it"] for r in rows) == list(range(1, ITERS + 1)), trial
            assert len({r["attempt"] for r in rows}) >= 2, trial
            rows_out = [json.loads(x) for x in
                        open(os.path.join(os.path.dirname(trial), "result.json"))]
            assert [r["training_iteration"] for r in rows_out] == list(range(1, ITERS + 1))
        assert "Traceback" not in run.stderr
        logs = "".join(open(p, errors="replace").read() for p in
                       glob.glob(str(tmp_path / "config" / "dasktune" / "clusters" / name /
                                     "jobs" / "*.err")))
        assert "retiring gracefully" in logs
        head_log = (tmp_path / "config" / "dasktune" / "clusters" / name / "head.log")
        # The head asked for a replacement before a job's worker retired.
        assert re.search(r"replacement job\(s\) ahead: [1-9]", head_log.read_text())
        assert "ConnectionPool is closed" not in logs
        assert "/dasktune/" not in logs  # no traceback through dasktune's code
    finally:
        down = dasktune("down", str(cluster_file), "-y")
    assert down.returncode == 0, down.stderr
    assert not state_file.exists()
    assert not psutil.pid_exists(head_pid) or \
        psutil.Process(head_pid).status() == psutil.STATUS_ZOMBIE
    wait_for(lambda: not _queue(name), timeout=60,
             interval=1.0, what="the cluster's jobs to leave squeue")
