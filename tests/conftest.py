"""Shared fixtures: the embedded cluster, and real ``dask scheduler``/``dask worker`` processes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

import dasktune
from dasktune.layout import checkpoint_index
from dasktune.storage import MANIFEST

os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__TICK__LIMIT", "30s")


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05,
             what: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and waiting for its reaper, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def driver_life(script: Path, args: list[str], logfile: Path,
                env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """One life of the driver ``script`` (``python script *args``, output to ``logfile``)
    in its own process group, so that :func:`kill_driver` takes the driver and any
    embedded cluster at once; killed on the way out if it still runs."""
    with open(logfile, "w") as log:
        driver = subprocess.Popen([sys.executable, str(script), *args], env=env,
                                  stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=str(logfile.parent))
        try:
            yield driver
        finally:
            kill_driver(driver)


def kill_driver(driver: subprocess.Popen) -> None:
    """SIGKILL the process group of a driver started by :func:`driver_life`, if it runs."""
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(10)


def driver_lives(script: Path, args: list[str], logdir: Path, *, progress: Callable[[], int],
                 rng: random.Random, kills: int = 3, step: tuple[int, int] = (4, 12),
                 jitter: float = 0.0, max_lives: int = 8, env: dict[str, str] | None = None,
                 before_kill: Callable[[int], None] | None = None,
                 timeout: float = 90.0, finish_timeout: float = 180.0) -> tuple[int, int, str]:
    """Run the driver ``script`` (``python script *args``, in its own process group) again
    and again: in each of its first ``kills`` lives, once ``progress()`` grew by a seeded
    number of steps in ``step`` (and a seeded pause up to ``jitter`` s), SIGKILL the whole
    group (the driver and any embedded cluster); then let a last life run to its end.
    ``before_kill(life)`` checks the storage while the life runs. Returns (lives, kills,
    the last life's output); fails if the last life did not exit with 0."""
    lives = done_kills = 0
    while True:
        lives += 1
        assert lives <= max_lives, "the experiment never finished"
        logfile = logdir / f"driver-{lives}.log"
        with driver_life(script, args, logfile, env) as driver:
            if done_kills < kills:
                before = progress()
                goal = before + rng.randint(*step)
                wait_for(lambda goal=goal, driver=driver: progress() >= goal or
                         driver.poll() is not None,
                         timeout=timeout, what=f"progress to {goal} in driver life {lives}")
                if driver.poll() is None and jitter:
                    time.sleep(rng.uniform(0, jitter))
                if driver.poll() is None:
                    if before_kill is not None:
                        before_kill(lives)
                    kill_driver(driver)
                    done_kills += 1
                    continue
            driver.wait(finish_timeout)
        out = logfile.read_text()
        assert driver.returncode == 0, out[-3000:]
        return lives, done_kills, out


def read_jsonl(path: str) -> list[dict]:
    """Every complete JSON line of ``path`` ([] before it exists; a line still being
    written is left out)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def logged_rows(exp: str) -> int:
    """Rows the drivers have written to the trials' ``result.json`` files so far."""
    n = 0
    for d in os.listdir(exp) if os.path.isdir(exp) else []:
        path = os.path.join(exp, d, "result.json")
        if os.path.exists(path):
            with open(path) as f:
                n += sum(1 for line in f if line.endswith("\n"))
    return n


def logged_iterations(trial_dir: str, tag: str) -> dict[str, list[int]]:
    """The ``training_iteration`` of each row a trial's result files hold, by file:
    ``result.json``, ``progress.csv``, TensorBoard (the steps of the scalar ``tag`` in
    every event file of the folder, read with TensorBoard's own loader) and
    ``checkpoints`` (the committed checkpoint folders' iterations)."""
    import csv
    import json

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[int]] = {}
    with open(os.path.join(trial_dir, "result.json")) as f:
        out["result.json"] = [json.loads(line)["training_iteration"] for line in f]
    with open(os.path.join(trial_dir, "progress.csv"), newline="") as f:
        out["progress.csv"] = [int(row["training_iteration"]) for row in csv.DictReader(f)]
    steps = []
    for name in sorted(os.listdir(trial_dir)):
        if name.startswith("events.out.tfevents."):
            for event in EventFileLoader(os.path.join(trial_dir, name)).Load():
                if any(v.tag == tag for v in event.summary.value):
                    steps.append(int(event.step))
    out["tensorboard"] = steps
    out["checkpoints"] = [int(m["training_iteration"]) for m in committed_manifests(trial_dir)]
    return out


def committed_manifests(trial_dir: str) -> list[dict[str, Any]]:
    """The commit manifests of a trial folder's committed checkpoints, in name order."""
    out = []
    for name in sorted(os.listdir(trial_dir)):
        path = os.path.join(trial_dir, name, MANIFEST)
        if checkpoint_index(name) is not None and os.path.exists(path):
            with open(path) as f:
                out.append(json.load(f))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> str | None:
    """The page at ``url`` (a local server), or None while it does not answer 200."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - localhost
            return r.read().decode(errors="replace") if r.status == 200 else None
    except OSError:
        return None


@pytest.fixture(scope="session")
def _shutdown_at_end() -> Iterator[None]:
    yield
    dasktune.shutdown()


@pytest.fixture
def local_client(_shutdown_at_end: None) -> object:
    """The embedded cluster (2 worker processes), started once and shared; a test that
    connects dasktune elsewhere shuts it down and the next user starts it again."""
    from dasktune import runtime

    if runtime.is_initialized() and runtime._cluster is None:
        dasktune.shutdown()  # connected to some other cluster by an earlier test
    if not runtime.is_initialized():
        dasktune.init(num_cpus=2, dashboard_address="127.0.0.1:0")
    return runtime._client


@pytest.fixture
def connect(_shutdown_at_end: None):
    """``connect(address)``: point dasktune at another cluster for this test."""
    def _connect(address: str) -> object:
        dasktune.shutdown()
        return dasktune.init(address=address)

    yield _connect
    dasktune.shutdown()


@pytest.fixture
def storage_path(tmp_path) -> str:
    return str(tmp_path / "results")


@dataclass
class DaskProcesses:
    """A real scheduler and workers as separate processes, killed by PID at the end."""

    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    logdir: str = ""

    def add_worker(self, *args: str, nthreads: int = 1, resources: str | None = None,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "distributed.cli.dask_worker", self.address,
               "--nthreads", str(nthreads), "--no-dashboard", "--host", "127.0.0.1",
               "--resources", resources or f"CPU={nthreads}", *args]
        log = open(os.path.join(self.logdir, f"worker-{len(self.workers)}.log"), "wb")
        proc = subprocess.Popen(cmd, env={**self.env, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(proc)
        return proc

    def client(self):
        from distributed import Client

        return Client(self.address, set_as_default=False, timeout="20s")

    def wait_workers(self, n: int, timeout: float = 60.0) -> None:
        client = self.client()
        try:
            client.wait_for_workers(n, timeout=timeout)
        finally:
            client.close()

    def kill_all(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)


@pytest.fixture
def dask_processes(tmp_path) -> Iterator[Callable[..., DaskProcesses]]:
    """Factory: start ``dask scheduler`` + ``n`` ``dask worker`` processes on 127.0.0.1."""
    started: list[DaskProcesses] = []

    def start(n_workers: int = 2, nthreads: int = 1, resources: str | None = None,
              env: dict[str, str] | None = None) -> DaskProcesses:
        port = free_port()
        full_env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
                    **(env or {})}
        logdir = tmp_path / f"dask-logs-{len(started)}"
        logdir.mkdir()
        log = open(logdir / "scheduler.log", "wb")
        sched = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", str(port), "--dashboard-address", "127.0.0.1:0"],
            env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs = DaskProcesses(address=f"tcp://127.0.0.1:{port}", scheduler=sched, env=full_env,
                              logdir=str(logdir))
        started.append(procs)
        for _ in range(n_workers):
            procs.add_worker(nthreads=nthreads, resources=resources)
        if n_workers:
            procs.wait_workers(n_workers)
        return procs

    yield start
    for procs in started:
        procs.kill_all()


@pytest.fixture
def restore_dask_config() -> Iterator[None]:
    """Undo what a test does to the global dask config (``VMCluster(security=True)``
    sets TLS options there)."""
    import copy

    import dask.config

    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


@contextlib.contextmanager
def moto_ec2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, region: str,
             key_id: str = "testing", secret: str = "testing") -> Iterator[object]:
    """moto's server on 127.0.0.1 as the EC2 endpoint (through ``AWS_ENDPOINT_URL``) with
    fake credentials and a private ``XDG_CONFIG_HOME``; yields a boto3 EC2 client."""
    import boto3
    from moto import server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", region)
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield boto3.client("ec2", region_name=region, endpoint_url=url)
    finally:
        server.stop()


def aws_spot_cluster(ec2: object, *, workers: int, security: bool) -> dict:
    """``cluster/aws-spot.yaml`` pointed at moto's image and security group, with
    ``workers`` workers and TLS (``provider.security``) on or off."""
    import yaml

    with open("cluster/aws-spot.yaml") as f:
        data = yaml.safe_load(f)
    ami = ec2.describe_images()["Images"][0]["ImageId"]  # type: ignore[attr-defined]
    sg = ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]  # type: ignore[attr-defined]
    for node in data["available_node_types"].values():
        node["node_config"].update(ImageId=ami, SecurityGroupIds=[sg])
    data["min_workers"] = data["max_workers"] = workers
    data["provider"]["security"] = security
    return data
