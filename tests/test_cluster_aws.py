"""AWS provider through moto's EC2 server on 127.0.0.1, with a real scheduler standing in for
the (unrunnable) moto VMs at the narrowest seam, ``EC2Instance.configure_vm``."""

from __future__ import annotations

import base64
import copy
import os
import re
import signal
import socket

import dask.config
import pytest

pytest.importorskip("dask_cloudprovider.aws")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from dask_cloudprovider.aws import ec2 as cp_ec2  # noqa: E402

from dasktune.cluster import get_provider, parse_cluster_config  # noqa: E402
from tests.conftest import aws_spot_cluster, moto_ec2, wait_for  # noqa: E402

REGION = "us-west-2"


@pytest.fixture
def moto(monkeypatch, tmp_path):
    with moto_ec2(monkeypatch, tmp_path, REGION) as ec2:
        yield ec2


@pytest.fixture
def loopback_only(monkeypatch):
    """Fail any connection from this process that would leave 127.0.0.1."""
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            assert host in ("127.0.0.1", "::1", "localhost"), f"connection to {address}"
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def captured(monkeypatch):
    """RunInstances parameters as sent, via a botocore event hook on the cluster's session."""
    calls: list[dict] = []
    real_get_session = cp_ec2.get_session

    def get_session():
        session = real_get_session()
        # Runs after dasktune's MaxPrice hook (provide-client-params) has edited the params.
        session.register("before-parameter-build.ec2.RunInstances",
                         lambda params, **kw: calls.append(copy.deepcopy(params)))
        return session

    monkeypatch.setattr(cp_ec2, "get_session", get_session)
    return calls


def _cluster_file(ec2) -> dict:
    # The stand-in scheduler speaks plain tcp.
    return aws_spot_cluster(ec2, workers=2, security=False)


def _point_vms_at(monkeypatch, port: int | None, on_worker) -> None:
    """Moto VMs run nothing: report 127.0.0.1 as their IP and start a real worker instead
    (``on_worker(vm)``: the EC2Worker, whose ``instance`` is moto's)."""
    real = cp_ec2.EC2Instance.configure_vm

    async def configure_vm(self, client):
        await real(self, client)  # tags the instance, as on EC2
        if isinstance(self, cp_ec2.EC2Scheduler):
            self.port = port or 1  # port 1: nothing ever answers
        else:
            on_worker(self)
        return "127.0.0.1", None

    monkeypatch.setattr(cp_ec2.EC2Instance, "configure_vm", configure_vm)


def _live(ec2) -> list[dict]:
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]


def test_up_issues_spot_run_instances_and_down_terminates(
        moto, captured, loopback_only, monkeypatch, dask_processes):
    procs = dask_processes(n_workers=1)  # a real scheduler; its first worker is not ours
    first = procs.workers.pop()
    first.kill()
    first.wait(10)
    port = int(procs.address.rsplit(":", 1)[1])
    _point_vms_at(monkeypatch, port, lambda vm: procs.add_worker(resources="CPU=2"))
    config = parse_cluster_config(_cluster_file(moto))
    provider = get_provider(config, name="moto-test")

    # The spot plugin's metadata poll must stay on loopback too (nothing serves there: 404).
    with dask.config.set({"dasktune.cluster.spot-notice-url": "http://127.0.0.1:9/notice"}):
        state = provider.up(timeout=30)
    assert state["scheduler_address"] == f"tcp://127.0.0.1:{port}"
    assert len(provider.workers()) == 2
    with provider.connect() as client:  # spot workers watch for interruption notices
        plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
    assert all("dasktune-spot-interruption" in p for p in plugins.values())

    workers = [c for c in captured if "InstanceMarketOptions" in c]
    heads = [c for c in captured if "InstanceMarketOptions" not in c]
    assert len(workers) == 2 and len(heads) == 1
    w = workers[0]
    assert w["InstanceMarketOptions"] == {
        "MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time", "MaxPrice": "1"}}
    assert w["InstanceType"] == "m5.large" and heads[0]["InstanceType"] == "c5.xlarge"
    assert w["ImageId"] == config.node_config("worker_nodes").ImageId
    user_data = w["UserData"]
    user_data = user_data if "pip install" in user_data else base64.b64decode(user_data).decode()
    assert "pip install dasktune" in user_data

    live = _live(moto)
    assert sorted(i["InstanceType"] for i in live) == ["c5.xlarge", "m5.large", "m5.large"]
    assert sum(i.get("InstanceLifecycle") == "spot" for i in live) == 2

    # `down` from a "new shell": a fresh provider that only knows the name.
    get_provider(config, name="moto-test").down()
    assert _live(moto) == []
    assert not provider.state.exists()


def _as_sent(params: dict) -> dict:
    """RunInstances parameters with the user data decoded and the per-VM name masked."""
    out = copy.deepcopy(params)
    user_data = out["UserData"]
    if "pip install" not in user_data:
        user_data = base64.b64decode(user_data).decode()
    out["UserData"] = re.sub(r"-worker-[0-9a-f]{8}", "-worker-<id>", user_data)
    return out


def test_up_again_tops_up_reclaimed_workers(moto, captured, loopback_only, monkeypatch,
                                            dask_processes):
    """A reclaimed spot worker: `up` again creates exactly the missing worker VM, as the
    first `up` did, and the scheduler is back to min_workers; a gone scheduler is an error."""
    procs = dask_processes(n_workers=0)
    port = int(procs.address.rsplit(":", 1)[1])
    by_instance = {}

    def on_worker(vm):
        # No nanny: one process per VM, quick to start and to kill with its VM.
        by_instance[vm.instance["InstanceId"]] = procs.add_worker("--no-nanny",
                                                                  resources="CPU=2")

    _point_vms_at(monkeypatch, port, on_worker)
    config = parse_cluster_config(_cluster_file(moto))
    provider = get_provider(config, name="moto-topup")
    with dask.config.set({"dasktune.cluster.spot-notice-url": "http://127.0.0.1:9/notice"}):
        provider.up(timeout=30)
        first = [c for c in captured if "InstanceMarketOptions" in c]
        assert len(first) == 2 and len(provider.workers()) == 2

        victim = sorted(by_instance)[0]  # the cloud reclaims one spot VM, its worker dies
        moto.terminate_instances(InstanceIds=[victim])
        os.killpg(by_instance[victim].pid, signal.SIGKILL)
        by_instance[victim].wait(10)
        wait_for(lambda: len(provider.workers()) == 1, timeout=15, what="the worker to leave")

        captured.clear()
        messages: list[str] = []
        provider.up(timeout=30, progress=messages.append)
    (again,) = captured  # one RunInstances: the missing worker, nothing for the head
    assert _as_sent(again) == _as_sent(first[0])  # same market, type, AMI, user data, tags
    assert again["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "1"
    assert "with 1 worker instance(s); creating 1 worker VM(s)" in messages[0]
    assert "workers joined 2/2" in messages
    assert len(provider.workers()) == 2
    assert len(provider.instances(role="worker")) == 2

    # Nothing missing: `up` creates nothing.
    captured.clear()
    provider.up(timeout=30)
    assert captured == []

    head = provider.instances(role="scheduler")
    moto.terminate_instances(InstanceIds=head)
    with pytest.raises(ValueError, match="scheduler instance is gone.*`dasktune down` then"):
        provider.up(timeout=30)
    provider.down()
    assert _live(moto) == []


def test_failing_up_is_bounded_and_leaves_nothing(moto, loopback_only, monkeypatch):
    _point_vms_at(monkeypatch, None, lambda vm: None)
    config = parse_cluster_config(_cluster_file(moto))
    provider = get_provider(config, name="moto-fail")
    with pytest.raises(TimeoutError, match="not up within 3s"):
        provider.up(timeout=3)
    assert _live(moto) == []
    assert not provider.state.exists()


def test_down_after_partial_up_cleans_up(moto, loopback_only, monkeypatch):
    """An `up` killed midway (instances created, no state) is still cleaned by `down`."""
    data = _cluster_file(moto)
    node = data["available_node_types"]["worker_nodes"]["node_config"]
    moto.run_instances(ImageId=node["ImageId"], InstanceType="m5.large", MinCount=1, MaxCount=1,
                       TagSpecifications=[{"ResourceType": "instance", "Tags": [
                           {"Key": "dasktune-cluster", "Value": "moto-partial"}]}])
    provider = get_provider(parse_cluster_config(data), name="moto-partial")
    assert len(provider.instances()) == 1
    provider.down()
    assert _live(moto) == []


def test_gpu_worker_type_alone_sets_gpu_instance(monkeypatch, restore_dask_config):
    """dask-cloudprovider decides GPU drivers from `instance_type` only; we decide per role."""
    import asyncio

    from dask_cloudprovider.generic.vmcluster import VMCluster

    from dasktune.cluster import load_cluster_config
    from dasktune.cluster.aws import ec2_cluster_kwargs, make_ec2_cluster_class

    async def no_start(self):
        return None

    monkeypatch.setattr(VMCluster, "_start", no_start)  # stop before any VM is created
    kwargs = ec2_cluster_kwargs(load_cluster_config("cluster/aws-gpu-spot.yaml"), "g")

    async def go():
        c = make_ec2_cluster_class()(asynchronous=True, shutdown_on_close=False, **kwargs)
        await c._start()
        c.status = c.status.closed
        return c.scheduler_options["gpu_instance"], c.worker_options["gpu_instance"]

    assert asyncio.run(go()) == (False, True)


HEAD_DRIVER = """
import argparse, signal
from distributed import Client

signal.alarm(60)  # a frozen scheduler would hang this driver (and the test) for good

p = argparse.ArgumentParser()
p.add_argument("--address", required=True)
args, rest = p.parse_known_args()
# The driver runs inside the scheduler's own host process tree and connects back to it:
# this only works if the scheduler keeps serving while it runs the driver.
with Client(args.address, timeout="15s") as client:
    print("answer", client.submit(lambda x: x * 2, 21).result(), rest, flush=True)
"""


def test_submit_exec_logs_through_a_serving_scheduler(dask_processes, monkeypatch, tmp_path,
                                                      capsys):
    """Head-node work runs inside the scheduler process (its VM is the head node): the
    scheduler must keep serving meanwhile, and a finished detached job must read as ended."""
    from dasktune.cluster import load_cluster_config

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    head = tmp_path / "head"  # the scheduler's home: where it keeps the jobs
    head.mkdir()
    procs = dask_processes(n_workers=1, env={"HOME": str(head)})
    provider = get_provider(load_cluster_config("cluster/aws-spot.yaml"), name="head-test")
    provider.state.write({"name": "head-test", "provider": "aws",
                          "scheduler_address": procs.address})

    assert provider.exec("echo on-the-head; exit 3") == 3
    assert "on-the-head" in capsys.readouterr().out

    script = tmp_path / "driver.py"
    script.write_text(HEAD_DRIVER)
    code, job = provider.submit(str(script), ["--x", "1"])
    assert (code, job) == (0, None)
    assert "answer 42 ['--x', '1']" in capsys.readouterr().out

    go = tmp_path / "go"
    script.write_text(HEAD_DRIVER + f"\nimport os, time\nwhile not os.path.exists({str(go)!r}):"
                      "\n    time.sleep(0.05)\nprint('bye', flush=True)\n")
    code, job = provider.submit(str(script), [], detach=True)
    assert code == 0 and job and provider.state.read()["jobs"] == [job]
    text, running = wait_for(lambda: (lambda r: r if "answer 42" in r[0] else None)(
        provider.logs()), timeout=30, what="the detached driver's answer")
    assert running
    go.write_text("")
    assert provider.follow(job) == 0  # `logs --follow`: the whole output, then its status
    assert capsys.readouterr().out.rstrip().endswith("bye")
    # It ends as a child the scheduler never waits for (a zombie): still "ended".
    wait_for(lambda: not provider.logs(job)[1], timeout=30, what="the job to read as ended")
    assert provider.logs(job)[0].rstrip().endswith("bye")


STREAMED = """
import argparse, os, signal, sys, time

signal.alarm(60)  # never outlive the test
p = argparse.ArgumentParser()
p.add_argument("--go", required=True)
p.add_argument("--pid", required=True)
p.add_argument("--address", required=True)
args = p.parse_args()
with open(args.pid + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(args.pid + ".tmp", args.pid)
print("first line", flush=True)
while not os.path.exists(args.go):  # the test creates it once it saw the first line
    time.sleep(0.05)
print("after go", flush=True)
sys.exit(7)
"""


@pytest.fixture
def head_cli(dask_processes, monkeypatch, tmp_path):
    """A recorded cloud cluster whose head is a real scheduler here; ``start(*args)`` runs
    ``dasktune submit`` on it as a separate process, its stdout read line by line."""
    import queue
    import subprocess
    import sys
    import threading

    from dasktune.cluster import load_cluster_config

    config_home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    head = tmp_path / "head"
    head.mkdir()
    procs = dask_processes(n_workers=0, env={"HOME": str(head)})
    provider = get_provider(load_cluster_config("cluster/aws-spot.yaml"), name="stream")
    provider.state.write({"name": "stream", "provider": "aws",
                          "scheduler_address": procs.address})
    script = tmp_path / "driver.py"
    script.write_text(STREAMED)
    started: list[subprocess.Popen] = []

    def start():
        proc = subprocess.Popen(
            [sys.executable, "-c", "from dasktune.cli import main; main()", "submit",
             "cluster/aws-spot.yaml", str(script), "-n", "stream", "--",
             "--go", str(tmp_path / "go"), "--pid", str(tmp_path / "pid")],
            env={**os.environ, "XDG_CONFIG_HOME": str(config_home)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        return proc, lines

    yield start
    for proc in started:  # only what this test started
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    _kill_driver(tmp_path / "pid")


def _kill_driver(pid_file) -> None:
    """The driver a test's submit started on the head (its PID in ``pid_file``), if it
    still runs: a failed test must not leave it behind."""
    import psutil

    try:
        driver = psutil.Process(int(pid_file.read_text()))
        if str(pid_file) in driver.cmdline():  # that driver, not a reused PID
            driver.kill()
            driver.wait(10)
    except (FileNotFoundError, ValueError, psutil.Error):
        pass


def test_submit_streams_the_driver_output_and_passes_its_exit_status(head_cli, tmp_path):
    proc, lines = head_cli()
    # The driver waits for `go` until this line reached the submit's own stdout: seeing
    # it proves the output is streamed, not collected until the end.
    assert lines.get(timeout=30) == "first line\n"
    (tmp_path / "go").write_text("")
    assert lines.get(timeout=30) == "after go\n"
    assert lines.get(timeout=30) is None
    assert proc.wait(30) == 7, proc.stderr.read()


def test_ctrl_c_in_a_submit_stops_the_driver_on_the_head(head_cli, tmp_path):
    import psutil

    proc, lines = head_cli()
    assert lines.get(timeout=30) == "first line\n"
    driver = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    assert "interrupted: stopped the driver (job-" in proc.stderr.read()

    def gone():
        try:
            return psutil.Process(driver).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, timeout=10, what="the driver to be stopped")
    assert not (tmp_path / "go").exists()  # it was stopped, not finished
