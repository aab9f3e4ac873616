"""GCP: the instance body dask-cloudprovider would send, checked at ``create_gcp_config``."""

from __future__ import annotations

import asyncio
import copy

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
def restore_dask_config():
    """VMCluster(security=True) sets TLS options in the global dask config: undo it."""
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


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
