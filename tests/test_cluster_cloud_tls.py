"""A cloud cluster with dask-cloudprovider's temporary TLS, end to end through moto.

The VMs moto creates run nothing, so at ``EC2Instance.configure_vm`` each one's own
command (what its user data would run) is started here, on 127.0.0.1: the scheduler and the
worker get their TLS credentials only the way a real VM does, through the dask config that
dask-cloudprovider serializes into that command. ``status``, ``exec`` and ``submit`` then run
as separate ``dasktune`` processes that know nothing but the state file (no cloud credential).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import ssl
import stat
import subprocess
import sys
import textwrap

import dask.config
import pytest
import yaml

pytest.importorskip("dask_cloudprovider.aws")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from click.testing import CliRunner  # noqa: E402
from dask_cloudprovider.aws import ec2 as cp_ec2  # noqa: E402

from dasktune.cli import main  # noqa: E402
from dasktune.cluster import get_provider, load_cluster_config  # noqa: E402
from tests.conftest import aws_spot_cluster, free_port, moto_ec2, wait_for  # noqa: E402

REGION = "us-west-2"
# Distinctive fake credentials: the test looks for them where they must never be.
KEY_ID, SECRET = "AKIADASKTUNETLSTEST0", "dasktune-tls-test-secret-sentinel"

TUNER = textwrap.dedent("""
    import argparse
    from distributed import Client
    import dasktune as tune

    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--address", required=True)
    args = p.parse_args()

    def train(config):
        tune.report({"score": config["x"] * 10})

    with Client(args.address, timeout="30s") as client:
        over = client.scheduler.address
        results = tune.Tuner(
            train, param_space={"x": tune.grid_search([1, 2])},
            run_config=tune.RunConfig(name="tls_exp", storage_path=args.storage, verbose=0),
        ).fit()
    best = results.get_best_result(metric="score", mode="max")
    print("over", over, "trials", len(results), "errors",
          len(results.errors), "best", best.metrics["score"], flush=True)
""")


@pytest.fixture
def moto(monkeypatch, tmp_path):
    with moto_ec2(monkeypatch, tmp_path, REGION, KEY_ID, SECRET) as ec2:
        yield ec2


@pytest.fixture
def vms_run_here(monkeypatch, tmp_path):
    """Each created VM runs its own command here instead (scheduler on a free port);
    yields the processes, killed by process group at the end (only these)."""
    started: list[subprocess.Popen] = []
    head = tmp_path / "head"  # the scheduler VM's home: where it keeps the jobs
    head.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DASK_DISTRIBUTED__COMM"))}
    # `python` in the VM's command is this interpreter.
    env.update(HOME=str(head), PATH=f"{os.path.dirname(sys.executable)}:{env['PATH']}")
    port = free_port()
    real = cp_ec2.EC2Instance.configure_vm

    async def configure_vm(self, client):
        await real(self, client)  # tags the instance, as on EC2
        command = self.command
        if isinstance(self, cp_ec2.EC2Scheduler):
            self.port = port
            # Where the VM would listen on 0.0.0.0:8786, listen on loopback only.
            command += (f" --host 127.0.0.1 --port {port}"
                        " --dashboard-address 127.0.0.1:0")
        else:
            # The command sits in a single-quoted YAML string in the user data, where ''
            # stands for one quote.
            command = command.replace("''", "'")
        log = open(tmp_path / f"{self.name}.log", "wb")
        started.append(subprocess.Popen(command, shell=True, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True))
        return "127.0.0.1", None

    monkeypatch.setattr(cp_ec2.EC2Instance, "configure_vm", configure_vm)
    yield started
    for proc in reversed(started):  # workers, then the scheduler
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _cluster_file(ec2, path) -> str:
    # TLS is dask-cloudprovider's default, said out loud.
    path.write_text(yaml.safe_dump(aws_spot_cluster(ec2, workers=1, security=True)))
    return str(path)


def _refused_without_client_cert(address: str, ca: str) -> bool:
    """Whether the scheduler ends a TLS session that trusts its CA but shows no client
    certificate (mutual TLS), instead of speaking Dask on it."""
    host, port = address.split("://")[1].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False  # dask's temporary certificate names no host
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:
                tls.recv(1)  # TLS 1.3 reports the refusal on the first read
        except ssl.SSLError as e:  # not a failed check of the server's certificate
            return "CERTIFICATE_REQUIRED" in str(e)
    return False  # with a client certificate, the scheduler greets first


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A separate `dasktune` process: the state file is all it knows (no AWS variable,
    no TLS setting of its own)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DASK_DISTRIBUTED__COMM"))}
    r = subprocess.run([sys.executable, "-c", "from dasktune.cli import main; main()", *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"dasktune {shlex.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_tls_cluster_up_status_exec_submit(moto, vms_run_here, restore_dask_config, tmp_path):
    cluster = _cluster_file(moto, tmp_path / "cluster.yaml")
    name = ["-n", "tls-e2e"]
    # The spot plugin's metadata poll stays on loopback (nothing serves there).
    with dask.config.set({"dasktune.cluster.spot-notice-url": "http://127.0.0.1:9/notice"}):
        r = CliRunner().invoke(main, ["up", cluster, "-y", *name, "--timeout", "60"])
    assert r.exit_code == 0, r.output
    assert "workers joined 1/1" in r.output
    assert "is up" in r.output and ": tls://127.0.0.1:" in r.output

    state_path = tmp_path / "config" / "dasktune" / "clusters" / "tls-e2e.json"
    state = json.loads(state_path.read_text())
    assert state["scheduler_address"].startswith("tls://")
    private = [state_path, *(state["tls"][k] for k in ("ca", "cert", "key"))]
    for path in private:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert "PRIVATE KEY" in open(state["tls"]["key"]).read()
    text = state_path.read_text()
    assert KEY_ID not in text and SECRET not in text and "PRIVATE KEY" not in text

    # A reclaimed worker VM; `up` again adds one with the credentials from the state files
    # alone (the dask config the first `up` changed is reset), and it joins over TLS.
    provider = get_provider(load_cluster_config(cluster), "tls-e2e")
    moto.terminate_instances(InstanceIds=provider.instances(role="worker"))
    worker = vms_run_here[1]
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(10)
    wait_for(lambda: not provider.workers(), timeout=15, what="the worker to leave")
    dask.config.refresh()
    assert not dask.config.get("distributed.comm.tls.client.cert")

    assert _refused_without_client_cert(state["scheduler_address"], state["tls"]["ca"])

    with dask.config.set({"dasktune.cluster.spot-notice-url": "http://127.0.0.1:9/notice"}):
        r = CliRunner().invoke(main, ["up", cluster, "-y", *name, "--timeout", "60"])
    assert r.exit_code == 0, r.output
    assert "creating 1 worker VM(s)" in r.output and "workers joined 1/1" in r.output

    r = _cli("status", cluster, *name)
    assert "address:   tls://127.0.0.1:" in r.stdout and "workers:   1" in r.stdout

    r = _cli("exec", cluster, "echo on-the-head", *name)
    assert r.stdout == "on-the-head\n"

    script = tmp_path / "tuner.py"
    script.write_text(TUNER)
    r = _cli("submit", cluster, str(script), *name, "--", "--storage",
             str(tmp_path / "results"))
    assert "over tls://127.0.0.1:" in r.stdout
    assert "trials 2 errors 0 best 20" in r.stdout

    r = CliRunner().invoke(main, ["down", cluster, "-y", *name])  # needs the AWS credentials
    assert r.exit_code == 0, r.output
    live = [i for res in moto.describe_instances()["Reservations"] for i in res["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    assert live == [] and not state_path.exists()
    assert not os.path.exists(state["tls"]["key"])  # the keys go with the cluster
