"""dasktune on a real Slurm (``scripts/slurm-local.sh``): ``up / status / submit / down`` on
cluster/slurm.yaml with 1-minute jobs, and an experiment longer than any job.

Without ``--lifetime``, every worker retires itself before its job's time limit and its
trials move there gracefully: each trial ends with all its iterations, none run twice.
Meanwhile ``kill-random-worker --hard`` SIGKILLs a job that runs a trial: that trial
restarts in another job from its last checkpoint (every 5 iterations), re-running only
the iterations after it, and ``result.json`` still holds each iteration once.
The cluster listens on the loopback interface (``interface: lo``): a one-node Slurm needs
no other network, whatever this machine's own address or routes.
Skipped where Slurm cannot be started (not root, no apt); in CI (``CI=true``) it fails.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import psutil
import pytest
import yaml

from tests.conftest import free_port, http_get, read_jsonl, wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("dask_jobqueue")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS = 120  # 1 s each: every trial outlives two or three 1-minute jobs

# The experiment, run by `dasktune submit`: class trials that record each iteration they
# execute (attempt, time, batch job) in executed.jsonl. Also tests/test_sge.py's.
DRIVER = textwrap.dedent("""
    import argparse, json, os, time
    import dasktune as tune

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--sleep", type=float, default=1.0)
    args = p.parse_args()

    class Counter(tune.Trainable):
        def setup(self, config):
            self.i = 0
            ctx = tune.get_context()
            self.dir, self.attempt = ctx.get_trial_dir(), ctx.get_attempt()

        def step(self):
            time.sleep(self.config["sleep"])
            self.i += 1
            with open(os.path.join(self.dir, "executed.jsonl"), "a") as f:
                job = os.environ.get("SLURM_JOB_ID") or os.environ["JOB_ID"]  # Slurm, SGE
                f.write(json.dumps({"attempt": self.attempt, "it": self.i, "t": time.time(),
                                    "job": job}) + "\\n")
            return {"i": self.i}

        def save_checkpoint(self, d):
            with open(os.path.join(d, "s.json"), "w") as f:
                json.dump({"i": self.i}, f)

        def load_checkpoint(self, d):
            with open(os.path.join(d, "s.json")) as f:
                self.i = json.load(f)["i"]

    tune.init(address=args.address)
    grid = tune.Tuner(
        Counter, param_space={"x": tune.grid_search(list(range(args.trials))),
                              "sleep": args.sleep},
        run_config=tune.RunConfig(
            storage_path=args.storage, name="exp", verbose=0,
            stop={"training_iteration": args.iters},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=5)),
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


def _queue(name: str, state: str | None = None) -> list[str]:
    """The ids of the cluster's jobs in squeue (in ``state`` only, if given)."""
    argv = ["squeue", "-h", "-n", name, "-o", "%i"] + (["-t", state] if state else [])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def _kill_a_trials_job(dasktune, cluster_file, storage) -> list[str]:
    """``kill-random-worker --hard`` while both trials run, until it has picked a job that
    ran one (it may pick the idle replacement job: the head replaces that one too);
    returns the jobs killed."""
    pattern = str(storage / "exp" / "*" / "executed.jsonl")

    def jobs_run() -> set[str]:
        return {r["job"] for p in glob.glob(pattern) for r in read_jsonl(p)}

    def both_running() -> bool:
        rows = [read_jsonl(p) for p in glob.glob(pattern)]
        now = time.time()
        return len(rows) == 2 and all(len(r) >= 3 and now - r[-1]["t"] < 3.0 for r in rows)

    killed: list[str] = []
    for _ in range(10):  # each pick hits a trial's job with odds of 2 in 3 at least
        wait_for(both_running, timeout=120, interval=0.5, what="both trials running")
        kill = dasktune("kill-random-worker", str(cluster_file), "--hard")
        assert kill.returncode == 0, kill.stderr
        killed += re.findall(r"killed job (\d+)", kill.stdout)
        if set(killed) & jobs_run():
            return killed
    raise AssertionError(f"kill-random-worker --hard never picked a trial's job: {killed}")


def test_up_status_submit_down_walltime_moves(slurm, tmp_path):
    with open(os.path.join(ROOT, "cluster", "slurm.yaml")) as f:
        data = yaml.safe_load(f)
    name = f"dt-test-{os.getpid()}"
    data["cluster_name"] = name
    data["provider"].pop("partition", None)  # the default partition of whatever Slurm
    node = data["available_node_types"]["worker_nodes"]["node_config"]
    node["walltime"] = "00:01:00"
    node["interface"] = "lo"  # scheduler and workers on 127.0.0.1
    cluster_file = tmp_path / "slurm.yaml"
    cluster_file.write_text(yaml.safe_dump(data))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           # 1-minute jobs: retire 20 s before the end, replacement asked 15 s before that.
           "DASK_DASKTUNE__CLUSTER__WALLTIME__MARGIN": "20s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__REPLACE_AHEAD": "15s",
           "DASK_DASKTUNE__CLUSTER__WALLTIME__POLL_INTERVAL": "5s"}
    argv = [sys.executable, "-c", "from dasktune.cli import main; main()"]

    def dasktune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*argv, *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=tmp_path)

    up = dasktune("up", str(cluster_file), "-y")
    state_file = tmp_path / "config" / "dasktune" / "clusters" / f"{name}.json"
    run = None
    try:
        assert up.returncode == 0, up.stderr
        head_pid = json.loads(state_file.read_text())["processes"][0]["pid"]
        state = json.loads(state_file.read_text())
        assert state["scheduler_address"].startswith("tcp://127.0.0.1:")
        status = dasktune("status", str(cluster_file))
        assert status.returncode == 0, status.stderr
        assert "workers:   2" in status.stdout and "slurm jobs:" in status.stdout
        assert "running" in status.stdout and "time left 00:00:" in status.stdout
        # exec --port-forward on the login node: a server started through exec answers
        # on the port where the user typed the command, until Ctrl-C.
        head_port, local_port = free_port(), free_port()
        fwd = subprocess.Popen(
            [*argv, "exec", str(cluster_file),
             f"{sys.executable} -m http.server {head_port} --bind 127.0.0.1",
             "--port-forward", f"{local_port}:{head_port}"], env=env, cwd=tmp_path,
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            page = wait_for(lambda: http_get(f"http://127.0.0.1:{local_port}/"), timeout=60,
                            interval=0.5, what="the server on the forwarded port")
            assert "slurm.yaml" in page  # the listing of the folder exec ran it in
            os.killpg(fwd.pid, signal.SIGINT)
            fwd_out, _ = fwd.communicate(timeout=60)
            assert f"forwarding localhost:{local_port} -> port {head_port}" in fwd_out
            assert http_get(f"http://127.0.0.1:{local_port}/") is None
        finally:
            if fwd.poll() is None:
                os.killpg(fwd.pid, signal.SIGKILL)  # our own exec's session, by its pid
                fwd.wait(10)

        storage = tmp_path / "results"
        out, err = open(tmp_path / "submit.out", "w+"), open(tmp_path / "submit.err", "w+")
        run = subprocess.Popen([*argv, "submit", str(cluster_file), str(driver), "--",
                                "--storage", str(storage), "--iters", str(ITERS)],
                               stdout=out, stderr=err, text=True, env=env, cwd=tmp_path)
        killed = _kill_a_trials_job(dasktune, cluster_file, storage)
        assert run.wait(400) == 0, (tmp_path / "submit.out").read_text()[-3000:] + \
            (tmp_path / "submit.err").read_text()[-3000:]
        stdout, stderr = (tmp_path / "submit.out").read_text(), \
            (tmp_path / "submit.err").read_text()
        (line,) = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        result = json.loads(line[len("RESULT "):])
        assert result == {"errors": [], "iterations": [ITERS, ITERS]}
        trials = glob.glob(str(storage / "exp" / "*" / "executed.jsonl"))
        assert len(trials) == 2
        hit = 0
        for trial in trials:
            rows = read_jsonl(trial)
            assert len({r["attempt"] for r in rows}) >= 2, trial  # across more than one job
            twice: set[int] = set()
            for attempt in sorted({r["attempt"] for r in rows if r["job"] in killed}):
                # SIGKILLed with its job: on in another job from its last checkpoint.
                hit += 1
                mine = [r for r in rows if r["attempt"] == attempt]
                after = [r for r in rows if r["attempt"] > attempt]
                assert after and after[0]["job"] not in killed, (attempt, rows)
                restored = after[0]["it"] - 1
                # Its newest checkpoint: every 5th iteration, or where the attempt began
                # (a walltime move's); one report (and its checkpoint) may be in flight.
                assert restored % 5 == 0 or restored == mine[0]["it"] - 1, (restored, mine)
                assert 0 <= mine[-1]["it"] - restored <= 6, (restored, mine)
                twice |= set(range(restored + 1, mine[-1]["it"] + 1))
            # Every iteration ran once (twice only those a SIGKILL took before a checkpoint),
            # and every walltime move lost nothing.
            counts = Counter(r["it"] for r in rows)
            assert sorted(counts) == list(range(1, ITERS + 1)), trial
            assert {i for i, n in counts.items() if n > 1} == twice, trial
            assert max(counts.values()) <= 2, trial
            rows_out = [json.loads(x) for x in
                        open(os.path.join(os.path.dirname(trial), "result.json"))]
            assert [r["training_iteration"] for r in rows_out] == list(range(1, ITERS + 1))
        assert hit >= 1  # a killed job ran a trial
        assert "Traceback" not in stderr
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
        if run is not None and run.poll() is None:
            run.kill()  # our own submit process, by its handle
            run.wait(10)
        down = dasktune("down", str(cluster_file), "-y")
    assert down.returncode == 0, down.stderr
    assert not state_file.exists()
    assert not psutil.pid_exists(head_pid) or \
        psutil.Process(head_pid).status() == psutil.STATUS_ZOMBIE
    wait_for(lambda: not _queue(name), timeout=60,
             interval=1.0, what="the cluster's jobs to leave squeue")
