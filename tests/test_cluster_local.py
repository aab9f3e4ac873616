"""The local provider end to end, each step a separate ``dasktune`` process."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.conftest import pid_alive, wait_for

DRIVER = textwrap.dedent("""
    import argparse, time
    from distributed import Client

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--address", required=True)
    args = p.parse_args()

    def trial(i):
        time.sleep(0.4)
        return i * i

    with Client(args.address) as client:
        futures = client.map(trial, range(args.n), retries=3, pure=False)
        done = 0
        for f in __import__("distributed").as_completed(futures):
            done += 1
            print(f"trial {f.result()} done ({done}/{args.n})", flush=True)
        print(f"all {done} trials done", flush=True)
""")


# A dasktune experiment whose trials report once, then wait for a file: the test decides
# when it finishes, so "running" is observed for sure rather than by timing.
# The experiment scripts' start: --storage, --go (the file that lets trials finish), --address.
EXPERIMENT_ARGS = textwrap.dedent("""
    import argparse, os, time
    from distributed import Client
    import dasktune as tune

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()
""")

TUNER = EXPERIMENT_ARGS + textwrap.dedent("""

    def train(config):
        tune.report({"x": config["x"]})
        while not os.path.exists(args.go):
            time.sleep(0.05)
        tune.report({"x": config["x"] + 1})

    with Client(args.address):
        results = tune.Tuner(
            train, param_space={"x": tune.grid_search([1, 2])},
            run_config=tune.RunConfig(name="status_exp", storage_path=args.storage,
                                      verbose=0),
        ).fit()
    print("experiment done, errors:", len(results.errors), flush=True)
""")


_CMD = [sys.executable, "-c", "from dasktune.cli import main; main()"]


def _cli(env, *args, check=True, timeout=60):
    r = subprocess.run([*_CMD, *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"dasktune {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}


def _state(env, name):
    path = os.path.join(env["XDG_CONFIG_HOME"], "dasktune", "clusters", f"{name}.json")
    with open(path) as f:
        return path, json.load(f)


def test_up_status_submit_kill_down(env, tmp_path):
    name = "e2e"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pids: list[int] = []
    try:
        r = _cli(env, "up", "cluster/local.yaml", "-y", "-n", name)
        assert "workers joined 2/2" in r.stderr
        path, state = _state(env, name)
        # The scheduler; its pool owns the workers (and replaces them, below).
        pids = [p["pid"] for p in state["processes"]] + _pool_pids(env, name)
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

        r = _cli(env, "status", "cluster/local.yaml", "-n", name)
        assert "address:   tcp://127.0.0.1:" in r.stdout
        # `status | head -1` ends quietly when head goes away.
        head = subprocess.run(f"{shlex.join(_CMD)} status cluster/local.yaml -n {name} | head -1",
                              shell=True, env=env, capture_output=True, text=True, timeout=60)
        assert head.stdout.startswith("cluster:") and head.stderr == "", head.stderr
        assert "workers:   2" in r.stdout and r.stdout.count("CPU=1") == 2
        assert "dashboard: http://127.0.0.1:" in r.stdout

        r = _cli(env, "submit", "cluster/local.yaml", str(script), "-n", name, "--detach",
                 "--", "--n", "16")
        assert "submitted job-" in r.stdout
        job = _state(env, name)[1]["jobs"][0]
        pids.append(job["pid"])
        assert stat.S_IMODE(os.stat(job["log"]).st_mode) == 0o600

        def logs():
            return _cli(env, "logs", "cluster/local.yaml", "-n", name).stdout

        wait_for(lambda: "done (1/16)" in logs(), timeout=30, what="the first trial")
        r = _cli(env, "kill-random-worker", "cluster/local.yaml", "-n", name, "--hard")
        killed = int(r.stdout.split("PID ")[1].rstrip(")\n"))
        assert killed in pids and not pid_alive(killed)

        # min_workers holds: a replacement starts without a second `up` (as Ray's
        # autoscaler replaces a lost node).
        first = set(pids)

        def replaced():
            new = set(_pool_pids(env, name)) - first
            pids.extend(new - set(pids))
            return new and "workers:   2" in _cli(env, "status", "cluster/local.yaml", "-n",
                                                   name).stdout
        wait_for(replaced, timeout=60, what="a replacement worker")
        wait_for(lambda: "all 16 trials done" in logs(), timeout=40, what="every trial")
        r = _cli(env, "status", "cluster/local.yaml", "-n", name)
        assert "workers:   2" in r.stdout and "finished" in r.stdout

        _cli(env, "down", "cluster/local.yaml", "-y", "-n", name)
        assert [p for p in pids if pid_alive(p)] == []
        assert not os.path.exists(path)
        assert not os.path.exists(os.path.dirname(job["log"]))  # logs gone with the cluster
        r = _cli(env, "status", "cluster/local.yaml", "-n", name, check=False)
        assert r.returncode == 1 and r.stderr.startswith("error: cluster 'e2e' is not up")
        assert "Traceback" not in r.stderr
    finally:
        for pid in pids:  # only what this test started
            if pid_alive(pid):
                psutil.Process(pid).kill()


def test_status_lists_running_then_finished_experiments(env, tmp_path):
    """`status` (its own process) shows a detached experiment while it runs, then done."""
    name = "exps"
    cfg = tmp_path / "one.yaml"
    cfg.write_text(open("cluster/local.yaml").read())
    script = tmp_path / "tuner.py"
    script.write_text(TUNER)
    go, storage = tmp_path / "go", tmp_path / "results"
    pids: list[int] = []
    try:
        _cli(env, "up", str(cfg), "-y", "-n", name)
        r = _cli(env, "status", str(cfg), "-n", name)
        assert "experiments: 0" in r.stdout
        _cli(env, "submit", str(cfg), str(script), "-n", name, "--detach", "--",
             "--storage", str(storage), "--go", str(go))
        state = _state(env, name)[1]
        pids = [p["pid"] for p in state["processes"] + state["jobs"]]

        def line():
            out = _cli(env, "status", str(cfg), "-n", name).stdout
            return next((ln.strip() for ln in out.splitlines()
                         if ln.strip().startswith("status_exp ")), "")

        # Both trials report, then block on `go`: the experiment is running.
        exp_path = storage / "status_exp"
        running = wait_for(lambda: (lambda ln: "RUNNING=2" in ln and ln)(line()), timeout=60,
                           what="both trials running in `status`")
        assert running == f"status_exp running trials: RUNNING=2 storage: {exp_path}"

        go.write_text("")
        done = wait_for(lambda: (lambda ln: "finished" in ln and ln)(line()), timeout=60,
                        what="the experiment finished in `status`")
        assert done == f"status_exp finished trials: TERMINATED=2 storage: {exp_path}"
        assert "errors: 0" in _cli(env, "logs", str(cfg), "-n", name).stdout
    finally:
        _cli(env, "down", str(cfg), "-y", "-n", name, check=False)
        assert [p for p in pids if pid_alive(p)] == []


ADAPTIVE_TUNER = TUNER.replace('grid_search([1, 2])', 'grid_search([1, 2, 3])').replace(
    'name="status_exp"', 'name="grow_exp"')

# One trial whose gang is three single-CPU ranks (its own slot {"CPU": 0}, Ray's default):
# the pool must grow to three workers for it, holding them until the test's go file.
GANG_TUNER = EXPERIMENT_ARGS + textwrap.dedent("""
    from dasktune.session import reserve_workers
    from dasktune.train import ScalingConfig

    def train(config):
        gang = reserve_workers([{"CPU": 1}] * 3)  # reserved with the trial's start
        tune.report({"ranks": len(set(gang.workers))})
        while not os.path.exists(args.go):
            time.sleep(0.05)

    with Client(args.address):
        results = tune.Tuner(
            tune.with_resources(train, ScalingConfig(num_workers=3)),
            run_config=tune.RunConfig(name="gang_exp", storage_path=args.storage,
                                      verbose=0),
        ).fit()
    print("experiment done, errors:", len(results.errors), flush=True)
""")


def _pool_pids(env, name):
    path = os.path.join(env["XDG_CONFIG_HOME"], "dasktune", "clusters", name,
                        "pool-workers.json")
    with open(path) as f:
        return [r["pid"] for r in json.load(f)]


# Dask tasks that hold their worker until the test creates a file: the queue stays long
# enough for Dask's adaptive_target to ask for more workers, however slowly they start.
BLOCKING_TASKS = textwrap.dedent("""
    import argparse, os, time
    from distributed import Client

    p = argparse.ArgumentParser()
    p.add_argument("--go", required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()

    def task(i):
        while not os.path.exists(args.go):
            time.sleep(0.05)
        return i

    with Client(args.address) as client:
        print("sum", sum(client.gather(client.map(task, range(6), pure=False))), flush=True)
""")


def _adaptive_cluster(env, tmp_path):
    """A min 1 / max 3 cluster file, and an environment that adapts every 200 ms."""
    cfg = tmp_path / "adaptive.yaml"
    cfg.write_text(open("cluster/local.yaml").read().replace(
        "min_workers: 2", "min_workers: 1").replace("max_workers: 2", "max_workers: 3"))
    env = {**env, "DASK_DISTRIBUTED__ADAPTIVE__INTERVAL": "200ms",
           "DASK_DISTRIBUTED__ADAPTIVE__WAIT_COUNT": "5",
           "DASK_DISTRIBUTED__ADAPTIVE__TARGET_DURATION": "1s"}
    return cfg, env


def _grow_then_shrink(env, tmp_path, name, script_text, script_args, running, finished):
    """up → submit --detach → `status` shows 3 workers and ``running`` → release → the
    job ends (``finished``) and the cluster is back at 1 worker → down leaves no process
    that was ever part of it."""
    cfg, env = _adaptive_cluster(env, tmp_path)
    script = tmp_path / "driver.py"
    script.write_text(script_text)
    go = tmp_path / "go"
    pids: set[int] = set()
    try:
        r = _cli(env, "up", str(cfg), "-y", "-n", name)
        assert "workers joined 1/1" in r.stderr
        pids |= {p["pid"] for p in _state(env, name)[1]["processes"]}
        pids |= set(_pool_pids(env, name))
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)  # scheduler + min_workers
        _cli(env, "submit", str(cfg), str(script), "-n", name, "--detach", "--",
             "--go", str(go), *script_args)
        pids |= {j["pid"] for j in _state(env, name)[1]["jobs"]}

        def status():
            pids.update(_pool_pids(env, name))  # every worker the pool ever started
            return _cli(env, "status", str(cfg), "-n", name).stdout

        wait_for(lambda: (lambda o: "workers:   3" in o and running in o)(status()),
                 timeout=90, what="the cluster to grow to 3 workers")
        go.write_text("")
        wait_for(lambda: (lambda o: "workers:   1" in o and finished in o)(status()),
                 timeout=90, what="the job to end and the cluster to shrink to 1 worker")
        assert len(pids) >= 5  # scheduler, job, 3 workers at least
        # The pool's workers are on record for chaos too, and the pool replaces them.
        r = _cli(env, "kill-random-worker", str(cfg), "-n", name, "--hard")
        killed = int(r.stdout.split("PID ")[1].rstrip(")\n"))
        assert killed in pids and not pid_alive(killed)
        wait_for(lambda: (lambda new: new and not new & {killed})(set(_pool_pids(env, name)))
                 and "workers:   1" in status(), timeout=60, what="a replacement worker")
        _cli(env, "down", str(cfg), "-y", "-n", name)
        assert [p for p in pids if pid_alive(p)] == []
        return _cli(env, "status", str(cfg), "-n", name, check=False)
    finally:
        _cli(env, "down", str(cfg), "-y", "-n", name, check=False)
        for pid in pids:  # only what this test started
            if pid_alive(pid):
                psutil.Process(pid).kill()


def test_adaptive_cluster_grows_for_queued_tasks_and_shrinks(env, tmp_path):
    """min 1 < max 3: Dask's AdaptiveCore, in the scheduler process, starts `dasktune
    worker`s for queued work and retires them when idle."""
    r = _grow_then_shrink(env, tmp_path, "grow", BLOCKING_TASKS, [], "job-", "finished")
    assert r.returncode == 1 and "is not up" in r.stderr


def test_adaptive_cluster_grows_for_waiting_trials(env, tmp_path):
    """Three concurrent 1-CPU trials on a 1-worker cluster: the waiting trials' demand
    grows it to 3, so all three run at once."""
    storage = tmp_path / "results"
    _grow_then_shrink(env, tmp_path, "trials", ADAPTIVE_TUNER, ["--storage", str(storage)],
                      "grow_exp running trials: RUNNING=3",
                      "grow_exp finished trials: TERMINATED=3")


def test_adaptive_cluster_grows_for_a_trials_gang(env, tmp_path):
    """A trial whose gang needs three worker processes, on a 1-worker cluster: the
    gang's demand grows it to 3 (a placeholder for the trial alone would not)."""
    storage = tmp_path / "results"
    _grow_then_shrink(env, tmp_path, "gangs", GANG_TUNER, ["--storage", str(storage)],
                      "gang_exp running trials: RUNNING=1",
                      "gang_exp finished trials: TERMINATED=1")


def test_min_workers_above_max_is_one_clear_error(env, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(open("cluster/local.yaml").read().replace("min_workers: 2",
                                                             "min_workers: 3"))
    r = _cli(env, "up", str(cfg), "-y", "-n", "bad", check=False)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"error: {cfg}: max_workers: Value error, must be >= min_workers (3)"]


def test_graceful_retire_exec_rsync(env, tmp_path):
    name = "chaos"
    pids: list[int] = []
    try:
        _cli(env, "up", "cluster/local.yaml", "-y", "-n", name)
        pids = [p["pid"] for p in _state(env, name)[1]["processes"]]
        src = tmp_path / "payload.txt"
        src.write_text("hello")
        r = _cli(env, "rsync-up", "cluster/local.yaml", str(src), str(tmp_path / "out" / "p.txt"),
                 "-n", name)
        assert (tmp_path / "out" / "p.txt").read_text() == "hello"

        r = _cli(env, "exec", "cluster/local.yaml", "echo $DASK_SCHEDULER_ADDRESS", "-n", name)
        assert r.stdout.startswith("tcp://127.0.0.1:")

        workers = set(_pool_pids(env, name))
        pids += list(workers)
        r = _cli(env, "kill-random-worker", "cluster/local.yaml", "-n", name)
        assert r.stdout.startswith("retired tcp://127.0.0.1:")
        retired = r.stdout.split()[1]

        def replaced():  # the pool keeps min_workers: a new worker for the retired one
            now = set(_pool_pids(env, name))
            pids.extend(now - set(pids))
            out = _cli(env, "status", "cluster/local.yaml", "-n", name).stdout
            return len(now - workers) == 1 and "workers:   2" in out and retired not in out
        wait_for(replaced, timeout=60, what="the retire and a replacement worker")
        r = _cli(env, "up", "cluster/local.yaml", "-y", "-n", name)  # nothing to top up
        assert "starting 0 worker(s)" in r.stderr and "workers joined 2/2" in r.stderr
        state = _state(env, name)[1]
        sched = [p["pid"] for p in state["processes"] if p["role"] == "scheduler"]
        assert sched == [pids[0]]  # the same scheduler: nothing was restarted
        pids += [p["pid"] for p in state["processes"]]
        r = _cli(env, "dashboard", "cluster/local.yaml", "-n", name)
        assert r.stdout.startswith("http://127.0.0.1:")
    finally:
        _cli(env, "down", "cluster/local.yaml", "-y", "-n", name, check=False)
        assert [p for p in pids if pid_alive(p)] == []


def test_rsync_down_copies_from_a_uri(env, tmp_path):
    results = tmp_path / "results" / "exp"
    results.mkdir(parents=True)
    (results / "progress.csv").write_text("a,b\n")
    dst = tmp_path / "local"
    _cli(env, "rsync-down", "cluster/local.yaml", f"file://{results}", str(dst))
    assert (dst / "exp" / "progress.csv").read_text() == "a,b\n"


def test_every_command_has_help_with_an_example():
    from click.testing import CliRunner

    from dasktune.cli import main

    for cmd in ("up", "down", "submit", "exec", "status", "dashboard", "logs",
                "kill-random-worker", "rsync-up", "rsync-down"):
        r = CliRunner().invoke(main, [cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.output, cmd


def test_errors_are_one_line_unless_verbose(env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: x\nprovider: {type: local}\nmax_workers: 1\n"
                   "available_node_types: {head: {}, w: {}}\nhead_node_type: head\nbogus: 1\n")
    r = _cli(env, "up", str(bad), "-y", check=False)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"error: {bad}: bogus: unknown key"]
    r = _cli(env, "--verbose", "up", str(bad), "-y", check=False)
    assert "Traceback" in r.stderr


def test_tls_cluster_through_the_cli(env, tmp_path):
    """Temporary TLS certificates (Security.temporary()), files 0600, tls:// everywhere."""
    cfg = tmp_path / "tls.yaml"
    cfg.write_text(open("cluster/local.yaml").read().replace(
        "provider: {type: local}", "provider: {type: local, tls: true}").replace(
        "min_workers: 2", "min_workers: 1"))
    pids: list[int] = []
    try:
        _cli(env, "up", str(cfg), "-y", "-n", "tls")
        path, state = _state(env, "tls")
        pids = [p["pid"] for p in state["processes"]]
        for f in state["tls"].values():
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
        r = _cli(env, "status", str(cfg), "-n", "tls")
        assert "address:   tls://127.0.0.1:" in r.stdout and "workers:   1" in r.stdout
        script = tmp_path / "tls_driver.py"
        script.write_text("import sys\nfrom distributed import Client\n"
                          "c = Client(sys.argv[sys.argv.index('--address') + 1])\n"
                          "print('sum', c.submit(sum, [1, 2]).result())\n")
        r = _cli(env, "submit", str(cfg), str(script), "-n", "tls")
        assert "sum 3" in r.stdout
    finally:
        _cli(env, "down", str(cfg), "-y", "-n", "tls", check=False)
        assert [p for p in pids if pid_alive(p)] == []


def test_submit_start_stop_detached_leaves_nothing(env, tmp_path):
    """`--start --stop --detach`: the job brings the cluster down itself when it ends."""
    cfg = tmp_path / "one.yaml"
    cfg.write_text(open("cluster/local.yaml").read().replace("min_workers: 2", "min_workers: 1"))
    script = tmp_path / "hello.py"
    go = tmp_path / "go"
    script.write_text("import os, sys, time\nprint('args', sys.argv[1:], flush=True)\n"
                      f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n")
    _cli(env, "submit", str(cfg), str(script), "-n", "once", "--start", "--stop",
             "--detach", "--", "--x", "1")
    path, state = _state(env, "once")
    pids = [p["pid"] for p in state["processes"] + state["jobs"]]
    try:
        wait_for(lambda: "args ['--x', '1', '--address', 'tcp://127.0.0.1:" in _cli(
            env, "logs", str(cfg), "-n", "once").stdout, timeout=30, what="the job's output")
        go.write_text("")  # the job may end now that we know its PIDs
        wait_for(lambda: not os.path.exists(path), timeout=30, what="the job's own down")
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10, what="no process left")
        assert not os.path.exists(os.path.dirname(state["jobs"][0]["log"]))
    finally:
        for pid in pids:
            if pid_alive(pid):
                psutil.Process(pid).kill()


def test_restart_only_keeps_detached_jobs_for_down(env, tmp_path):
    """`up --restart-only` restarts the Dask processes; a detached job stays on record, so
    `logs` still reads it and `down` still stops it."""
    cfg = tmp_path / "one.yaml"
    cfg.write_text(open("cluster/local.yaml").read().replace("min_workers: 2", "min_workers: 1"))
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('job started', flush=True)\n"
                      "deadline = time.monotonic() + 120\n"
                      "while time.monotonic() < deadline: time.sleep(0.05)\n")
    pids: list[int] = []
    try:
        _cli(env, "up", str(cfg), "-y", "-n", "rs")
        _cli(env, "submit", str(cfg), str(script), "-n", "rs", "--detach")
        path, before = _state(env, "rs")
        job = before["jobs"][0]
        pids = [p["pid"] for p in before["processes"]] + [job["pid"]]
        r = _cli(env, "up", str(cfg), "-y", "-n", "rs", "--restart-only")
        assert "restarting the Dask processes" in r.stderr and "workers joined 1/1" in r.stderr
        after = _state(env, "rs")[1]
        pids += [p["pid"] for p in after["processes"]]
        assert not any(pid_alive(p["pid"]) for p in before["processes"])  # really restarted
        assert after["scheduler_address"] != before["scheduler_address"]
        assert [j["job"] for j in after["jobs"]] == [job["job"]] and pid_alive(job["pid"])
        assert "job started" in _cli(env, "logs", str(cfg), "-n", "rs", job["job"]).stdout
        r = _cli(env, "status", str(cfg), "-n", "rs")
        assert f"{job['job']} running" in r.stdout

        _cli(env, "down", str(cfg), "-y", "-n", "rs")
        assert [p for p in pids if pid_alive(p)] == []
        assert not os.path.exists(path)
    finally:
        for pid in pids:
            if pid_alive(pid):
                psutil.Process(pid).kill()


def test_state_file_private_and_removed_with_its_folder(env, monkeypatch):
    """The atomic-replace temp file is 0600 even when a stale, wider one was left behind;
    `remove` takes the private folder (TLS keys, logs) along."""
    from dasktune.cluster import ClusterState

    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    state = ClusterState("priv")
    state.write({"name": "priv"})
    stale = state.path.with_suffix(".json.tmp")
    stale.write_text("{}")
    os.chmod(stale, 0o644)
    state.write({"name": "priv", "scheduler_address": "tcp://127.0.0.1:1"})
    assert stat.S_IMODE(os.stat(state.path).st_mode) == 0o600
    assert state.read()["scheduler_address"] == "tcp://127.0.0.1:1"

    key = state.private_file("tls-key.pem")
    log = state.private_file("scheduler.log")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    state.remove(keep_logs=True)  # a failed `up`: the logs its error names stay
    assert not state.exists() and not key.exists() and log.exists()
    state.remove()
    assert not state.dir.exists()
