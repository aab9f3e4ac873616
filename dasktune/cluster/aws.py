"""``provider: {type: aws}``: EC2 through ``dask_cloudprovider.aws.EC2Cluster``.

The subclass :class:`DasktuneEC2Cluster` fills two gaps of dask-cloudprovider without forking
it: spot ``MaxPrice`` (added to RunInstances through a botocore parameter hook) and GPU
drivers for a GPU worker type set only through ``worker_instance_type``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

from dasktune.cluster._cloud import TAG, CloudProvider, check_cli_options

__all__ = ["AWSProvider", "ec2_cluster_kwargs", "make_ec2_cluster_class"]

_GPU_FAMILIES = ("p", "g")


def ec2_cluster_kwargs(config: Any, name: str) -> dict[str, Any]:
    """The ``EC2Cluster`` arguments a validated AWS cluster file stands for."""
    head = config.node_config(config.head_node_type)
    worker = config.node_config(config.worker_type_name)
    if head.ImageId != worker.ImageId:
        raise ValueError("available_node_types.*.node_config.ImageId: dask-cloudprovider uses "
                         "one AMI for all nodes; give head and workers the same ImageId")
    groups = list(dict.fromkeys([*head.SecurityGroupIds, *worker.SecurityGroupIds]))
    market = worker.InstanceMarketOptions
    resources = dict(config.worker.resources)
    kwargs: dict[str, Any] = {
        "region": config.provider.region,
        "availability_zone": config.provider.availability_zone,
        "ami": worker.ImageId,  # never None: None makes dask-cloudprovider pick an Ubuntu AMI
        "scheduler_instance_type": head.InstanceType,
        "worker_instance_type": worker.InstanceType,
        "security_groups": groups,
        "subnet_id": worker.SubnetId or head.SubnetId,
        "key_name": worker.KeyName or head.KeyName,
        "iam_instance_profile": worker.IamInstanceProfile or head.IamInstanceProfile,
        "filesystem_size": worker.VolumeSize or head.VolumeSize or 40,
        "extra_bootstrap": list(config.setup_commands),
        "instance_tags": {TAG: name},
        "volume_tags": {TAG: name},
        "spot": market is not None,
        "max_price": market.SpotOptions.MaxPrice if market else None,
        "n_workers": config.min_workers,
        "security": config.provider.security,
        "scheduler_options": check_cli_options({"dashboard_address": ":8787"},
                                               "scheduler_options"),
        "worker_options": {"resources": {"CPU": 1, **resources}} if resources else {},
    }
    if config.docker_image:
        kwargs["docker_image"] = config.docker_image
    return {k: v for k, v in kwargs.items() if v is not None or k == "max_price"}


@functools.cache
def make_ec2_cluster_class() -> type:
    """``DasktuneEC2Cluster``, built on first use so dask-cloudprovider stays optional."""
    try:
        from dask_cloudprovider.aws import EC2Cluster
    except ImportError:
        raise ImportError('AWS clusters need dask-cloudprovider: '
                          'pip install "dask-cloudprovider[aws]"') from None

    class DasktuneEC2Cluster(EC2Cluster):
        """``EC2Cluster`` plus ``max_price`` for spot workers and per-role GPU detection."""

        def __init__(self, *args: Any, max_price: float | None = None, **kwargs: Any) -> None:
            self.max_price = max_price
            super().__init__(*args, **kwargs)

        def prepare_options(self) -> None:
            """What dasktune adds to the VM options; before any VM is created (``_start``,
            or a top-up that builds worker VMs from a never-started cluster)."""
            # EC2Cluster decides gpu_instance from `instance_type` only; decide per role.
            for opts in (self.scheduler_options, self.worker_options):
                itype = opts.get("instance_type") or ""
                opts["gpu_instance"] = itype.startswith(_GPU_FAMILIES)
            if self.max_price is not None and not getattr(self, "_max_price_hooked", False):
                self.boto_session.register("provide-client-params.ec2.RunInstances",
                                           self._add_max_price)
                self._max_price_hooked = True

        async def _start(self) -> None:
            self.prepare_options()
            await super()._start()

        def _add_max_price(self, params: dict[str, Any], **kwargs: Any) -> None:
            market = params.get("InstanceMarketOptions")
            if market and market.get("MarketType") == "spot":
                market.setdefault("SpotOptions", {})["MaxPrice"] = f"{self.max_price:g}"

    return DasktuneEC2Cluster


class AWSProvider(CloudProvider):
    """EC2 instances tagged ``dasktune-cluster=<name>``; found again by that tag."""

    kind = "aws"

    @property
    def spot(self) -> bool:
        return self.config.node_config(self.config.worker_type_name).InstanceMarketOptions \
            is not None

    def cluster_kwargs(self) -> dict[str, Any]:
        return ec2_cluster_kwargs(self.config, self.name)

    def cluster_class(self) -> type:
        return make_ec2_cluster_class()

    @functools.cached_property
    def _session(self) -> Any:
        from aiobotocore.session import get_session

        return get_session()  # one per provider: each new one loads the EC2 model again

    def _ec2(self) -> Any:
        return self._session.create_client("ec2", region_name=self.config.provider.region)

    def instances(self, *, role: str | None = None) -> list[str]:
        async def go() -> list[str]:
            async with self._ec2() as ec2:
                pages = ec2.get_paginator("describe_instances").paginate(Filters=[
                    {"Name": f"tag:{TAG}", "Values": [self.name]},
                    {"Name": "instance-state-name",
                     "Values": ["pending", "running", "stopping", "stopped"]},
                ])
                out = []
                async for page in pages:
                    for res in page["Reservations"]:
                        for inst in res["Instances"]:
                            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                            if role and f"-{role}" not in tags.get("Name", ""):
                                continue
                            out.append(inst["InstanceId"])
                return out

        return asyncio.run(go())

    def terminate(self, ids: Sequence[str]) -> None:
        async def go() -> None:
            async with self._ec2() as ec2:
                await ec2.terminate_instances(InstanceIds=list(ids))

        asyncio.run(go())
