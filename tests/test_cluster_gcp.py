"""GCP: the instance body dask-cloudprovider would send, checked at ``create_gcp_config``
and, for a top-up, at the Compute API client."""

from __future__ import annotations

import asyncio
import copy
import json
import re

import dask.config
import pytest

pytest.importorskip("dask_cloudprovider.gcp")

from dask_cloudprovider.gcp import instances as cp_gcp  # noqa: E402

from dasktune.cluster import load_cluster_config  # noqa: E402
from dasktune.cluster.gcp import gcp_cluster_kwargs, make_gcp_cluster_class  # noqa: E402


class _NoCompute:
    """Stands in for the Compute API client: this test must not call Google."""

    def __init__(self, *args, **kwargs):
        pass

    def instances(self):
        raise AssertionError("no API call expected")


@pytest.fixture
def bodies(monkeypatch, restore_dask_config):
    """role -> the instance body, from a DasktuneGCPCluster built (not started) in a loop."""
    monkeypatch.setattr(cp_gcp, "GCPCompute", _NoCompute)
    config = load_cluster_config("cluster/gcp-preemptible.yaml")

    async def build() -> dict:
        cls = make_gcp_cluster_class()
        c = cls(asynchronous=True, shutdown_on_close=False, **gcp_cluster_kwargs(config, "t"))
        c.scheduler_internal_ip, c.scheduler_port = "10.0.0.2", 8786
        c.render_process_cloud_init = lambda process: f"#cloud-config {process.command}"
        out = {role: _body(c, role) for role in ("worker", "scheduler")}
        c.status = c.status.closed  # never started: nothing to close
        return out

    return asyncio.run(build())


def _body(cluster, role: str) -> dict:
    if role == "worker":
        vm = cp_gcp.GCPWorker("tls://10.0.0.2:8786", **cluster.worker_options)
    else:
        cluster.scheduler_options["preemptible"] = cluster.head_preemptible  # as _start does
        vm = cp_gcp.GCPScheduler(**cluster.scheduler_options)
    vm.cloud_init = cluster.render_process_cloud_init(vm)
    return vm.create_gcp_config()


def test_worker_instance_is_preemptible_with_gpu_and_disk(bodies):
    body = bodies["worker"]
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-4"
    assert body["scheduling"]["preemptible"] == "true"
    assert body["scheduling"]["automaticRestart"] == "false"
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "50"
    (acc,) = body["guestAccelerators"]
    assert acc["acceleratorCount"] == 1 and acc["acceleratorType"].endswith("/nvidia-tesla-t4")
    assert body["labels"]["dasktune-cluster"] == "t"
    user_data = {i["key"]: i["value"] for i in body["metadata"]["items"]}["user-data"]
    assert '"resources": {"CPU": 4.0, "GPU": 1.0}' in user_data


def test_head_is_a_standard_vm_without_gpu(bodies):
    body = bodies["scheduler"]
    assert body["machineType"].endswith("/n1-standard-2")
    assert body["scheduling"]["preemptible"] == "false"
    assert "guestAccelerators" not in body
    user_data = {i["key"]: i["value"] for i in body["metadata"]["items"]}["user-data"]
    assert "--dashboard-address :8787" in user_data and "['" not in user_data


def _masked(body: dict) -> dict:
    """An instance body without its user data, the per-VM name masked."""
    text = json.dumps({k: v for k, v in body.items() if k != "metadata"})
    return json.loads(re.sub(r"dask-[0-9a-f]{8}-worker-[0-9a-f]{8}", "<name>", text))


class _RecordingCompute:
    """The Compute API client at its narrowest: inserts are recorded, VMs run at once."""

    inserted: list[dict] = []

    def __init__(self, *args, **kwargs):
        pass

    def instances(self):
        return self

    def insert(self, project, zone, body):
        self.inserted.append(copy.deepcopy(body))
        return _Call({"id": str(len(self.inserted))})

    def list(self, project, zone, filter):
        return _Call({"items": [{"status": "RUNNING", "networkInterfaces": [
            {"networkIP": "10.0.0.9", "accessConfigs": [{"natIP": "192.0.2.9"}]}]}]})


class _Call:
    def __init__(self, result):
        self.result = result

    def execute(self):
        return self.result


def test_top_up_creates_the_same_preemptible_worker_for_the_recorded_scheduler(
        bodies, monkeypatch, tmp_path):
    """`up` on a running GCP cluster builds GCPWorker VMs from the file, dialing the
    recorded internal address with the cluster's own TLS credentials and id."""
    from distributed.security import Security

    from dasktune.cluster import get_provider

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(cp_gcp, "GCPCompute", _RecordingCompute)
    monkeypatch.setattr(_RecordingCompute, "inserted", [])
    provider = get_provider(load_cluster_config("cluster/gcp-preemptible.yaml"), name="t")
    sec = Security.temporary()
    tls = provider.state.write_tls(sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key)
    provider.state.write({"name": "t", "provider": "gcp", "cluster_id": "c0ffee00",
                          "scheduler_address": "tls://198.51.100.2:8786",
                          "worker_contact": "tls://10.0.0.2:8786", "tls": tls})

    asyncio.run(provider._create_workers(2, timeout=10))
    first, second = _RecordingCompute.inserted
    assert first["name"] != second["name"] and first["name"].startswith("dask-c0ffee00-worker-")
    # All but the user data (other certificates) as the first `up` would send for a worker.
    assert _masked(first) == _masked(bodies["worker"])
    assert first["scheduling"]["preemptible"] == "true"
    user_data = {i["key"]: i["value"] for i in first["metadata"]["items"]}["user-data"]
    assert "distributed.cli.dask_spec tls://10.0.0.2:8786" in user_data
    assert '"resources": {"CPU": 4.0, "GPU": 1.0}' in user_data
    # The worker inherits the cluster's own certificate through dask-cloudprovider's config.
    inherited = re.search(r'DASK_INTERNAL_INHERIT_CONFIG="([^"]+)"', user_data).group(1)
    comm = dask.config.deserialize(inherited)["distributed"]["comm"]
    assert comm["tls"]["ca-file"] == sec.tls_ca_file and comm["require-encryption"] is True
