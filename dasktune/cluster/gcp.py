"""``provider: {type: gcp}``: GCE through ``dask_cloudprovider.gcp.GCPCluster``.

The subclass :class:`DasktuneGCPCluster` keeps the head on a standard VM while workers are
preemptible (``GCPCluster`` applies ``preemptible`` to every VM).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from dasktune.cluster._cloud import TAG, CloudProvider, check_cli_options

__all__ = ["GCPProvider", "gcp_cluster_kwargs", "make_gcp_cluster_class"]


def _disk_gb(node: Any) -> int | None:
    for disk in node.disks:
        if disk.boot and "diskSizeGb" in disk.initializeParams:
            return int(disk.initializeParams["diskSizeGb"])
    return None


def _gpus(node: Any) -> tuple[int, str | None]:
    if not node.guestAccelerators:
        return 0, None
    if len(node.guestAccelerators) > 1:
        raise ValueError("guestAccelerators: dask-cloudprovider supports one accelerator type")
    acc = node.guestAccelerators[0]
    return acc.acceleratorCount, acc.acceleratorType


def gcp_cluster_kwargs(config: Any, name: str) -> dict[str, Any]:
    """The ``GCPCluster`` arguments a validated GCP cluster file stands for."""
    head = config.node_config(config.head_node_type)
    worker = config.node_config(config.worker_type_name)
    w_gpus, w_type = _gpus(worker)
    h_gpus, h_type = _gpus(head)
    resources = {"CPU": 1.0, **config.worker.resources}
    if w_gpus and "GPU" not in resources:
        resources["GPU"] = float(w_gpus)
    kwargs: dict[str, Any] = {
        "projectid": config.provider.project_id,
        "zone": config.provider.zone,
        "scheduler_machine_type": head.machineType,
        "worker_machine_type": worker.machineType,
        "scheduler_ngpus": h_gpus,
        "scheduler_gpu_type": h_type,
        "worker_ngpus": w_gpus,
        "worker_gpu_type": w_type,
        "filesystem_size": _disk_gb(worker) or _disk_gb(head),
        "preemptible": worker.preemptible,
        "head_preemptible": head.preemptible,
        "instance_labels": {TAG: name},
        "extra_bootstrap": list(config.setup_commands),
        "n_workers": config.min_workers,
        "security": config.provider.security,
        # Workers get their options as a JSON spec (dicts survive); the scheduler's go on a
        # command line through str(), so only scalars are allowed there.
        "worker_options": {"resources": resources},
        "scheduler_options": check_cli_options({"dashboard_address": ":8787"},
                                               "scheduler_options"),
    }
    if config.docker_image:
        kwargs["docker_image"] = config.docker_image
    return {k: v for k, v in kwargs.items() if v is not None}


@functools.cache
def make_gcp_cluster_class() -> type:
    """``DasktuneGCPCluster``, built on first use so dask-cloudprovider stays optional."""
    try:
        from dask_cloudprovider.gcp import GCPCluster
    except ImportError:
        raise ImportError('GCP clusters need dask-cloudprovider: '
                          'pip install "dask-cloudprovider[gcp]"') from None

    class DasktuneGCPCluster(GCPCluster):
        """``GCPCluster`` with the head's preemptibility set apart from the workers'."""

        def __init__(self, *args: Any, head_preemptible: bool = False, **kwargs: Any) -> None:
            self.head_preemptible = head_preemptible
            super().__init__(*args, **kwargs)

        def prepare_options(self) -> None:
            """What dasktune changes in the VM options; before any VM is created."""
            self.scheduler_options["preemptible"] = self.head_preemptible

        async def _start(self) -> None:
            self.prepare_options()
            await super()._start()

    return DasktuneGCPCluster


class GCPProvider(CloudProvider):
    """GCE instances labelled ``dasktune-cluster=<name>``; found again by that label."""

    kind = "gcp"

    @property
    def spot(self) -> bool:
        return self.config.node_config(self.config.worker_type_name).preemptible

    def cluster_kwargs(self) -> dict[str, Any]:
        return gcp_cluster_kwargs(self.config, self.name)

    def cluster_class(self) -> type:
        return make_gcp_cluster_class()

    def worker_contact(self, cluster: Any) -> str:
        # GCPWorker dials the scheduler's internal IP, not the address this machine used.
        return f"{cluster.protocol}://{cluster.scheduler_internal_ip}:{cluster.scheduler_port}"

    def worker_vm(self, cluster: Any, contact: str) -> Any:
        # GCPWorker takes the address it dials from the cluster, not from its argument.
        host, port = contact.split("://", 1)[-1].rsplit(":", 1)
        cluster.scheduler_internal_ip, cluster.scheduler_port = host, int(port)
        return cluster.worker_class(contact, **cluster.worker_options)

    def _compute(self) -> Any:
        from dask_cloudprovider.gcp.instances import GCPCompute

        return GCPCompute()

    def instances(self, *, role: str | None = None) -> list[str]:
        p = self.config.provider
        resp = self._compute().instances().list(
            project=p.project_id, zone=p.zone, filter=f"labels.{TAG}={self.name}").execute()
        return [i["name"] for i in resp.get("items", [])
                if i.get("status") not in ("TERMINATED", "STOPPING")
                and (role is None or f"-{role}" in i["name"])]

    def terminate(self, ids: Sequence[str]) -> None:
        p = self.config.provider
        compute = self._compute()
        for name in ids:
            compute.instances().delete(project=p.project_id, zone=p.zone,
                                       instance=name).execute()
