"""The cluster file: a Ray-style YAML validated into typed models.

One top-level model (:class:`ClusterConfig`) plus one ``node_config`` model per provider, so a
mistake is reported with its path in the file (``available_node_types.worker_nodes.node_config.
InstanceType: field required``) instead of failing later inside a cloud API call.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "AWSNodeConfig",
    "BATCH_SYSTEMS",
    "BatchNodeConfig",
    "ClusterConfig",
    "ClusterConfigError",
    "GCPNodeConfig",
    "LocalNodeConfig",
    "NodeType",
    "ProviderConfig",
    "load_cluster_config",
    "parse_cluster_config",
]


class ClusterConfigError(ValueError):
    """A cluster file that cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


class ProviderConfig(_Strict):
    """``provider:``: where the machines come from."""

    type: Literal["local", "aws", "gcp", "slurm", "pbs", "sge", "lsf"]
    region: str | None = None
    availability_zone: str | None = None
    # GCP
    project_id: str | None = None
    zone: str | None = None
    # local: start scheduler and workers with temporary TLS certificates.
    tls: bool = False
    # cloud: dask-cloudprovider's clusters use temporary TLS unless told otherwise.
    security: bool = True
    # batch systems: the partition (PBS/SGE/LSF: queue) and account (SGE/LSF: project).
    partition: str | None = None
    account: str | None = None


class LocalNodeConfig(_Strict):
    """``node_config`` of a local node: nothing is required."""

    memory_limit: str | None = None


class _SpotOptions(_Strict):
    MaxPrice: float | None = Field(default=None, gt=0)
    SpotInstanceType: Literal["one-time"] = "one-time"


class _MarketOptions(_Strict):
    MarketType: Literal["spot"]
    SpotOptions: _SpotOptions = _SpotOptions()


class AWSNodeConfig(_Strict):
    """``node_config`` of an AWS node, in the EC2 RunInstances spelling Ray uses."""

    InstanceType: str
    ImageId: str = Field(pattern=r"^ami-[0-9a-zA-Z]+$")
    SecurityGroupIds: list[str] | None = None
    SubnetId: str | None = None
    KeyName: str | None = None
    IamInstanceProfile: dict[str, str] | None = None
    InstanceMarketOptions: _MarketOptions | None = None
    VolumeSize: int | None = Field(default=None, gt=0)


class _GCPDisk(_Strict):
    boot: bool = True
    autoDelete: bool = True
    initializeParams: dict[str, Any] = {}


class _GCPAccelerator(_Strict):
    acceleratorType: str
    acceleratorCount: int = Field(ge=1)


class _GCPScheduling(_Strict):
    preemptible: bool = False
    onHostMaintenance: Literal["TERMINATE", "MIGRATE"] | None = None


class GCPNodeConfig(_Strict):
    """``node_config`` of a GCP node, in the Compute API spelling Ray uses."""

    machineType: str
    disks: list[_GCPDisk] = []
    guestAccelerators: list[_GCPAccelerator] = []
    scheduling: list[_GCPScheduling] | _GCPScheduling = _GCPScheduling()

    @property
    def preemptible(self) -> bool:
        items = self.scheduling if isinstance(self.scheduling, list) else [self.scheduling]
        return any(s.preemptible for s in items)


BATCH_SYSTEMS = ("slurm", "pbs", "sge", "lsf")


class BatchNodeConfig(_Strict):
    """``node_config`` of a batch-system node: one job's shape (dask-jobqueue's keywords).

    Each job runs ``processes`` Dask workers sharing ``cores``, ``memory`` and ``gpus``;
    each worker advertises its share as the ``CPU``, ``GPU`` and ``memory`` resources.
    """

    cores: int = Field(default=1, ge=1)
    memory: str = "4GB"
    processes: int = Field(default=1, ge=1)
    walltime: str | None = None          # e.g. "01:00:00"; None: the partition's default
    gpus: int = Field(default=0, ge=0)   # Slurm: --gres=gpu:N; LSF: -gpu "num=N"
    job_extra_directives: list[str] = []
    job_script_prologue: list[str] = []
    worker_extra_args: list[str] = []
    interface: str | None = None
    local_directory: str | None = None
    python: str | None = None

    @field_validator("processes")
    @classmethod
    def _divides(cls, v: int, info: Any) -> int:
        cores = info.data.get("cores", 1)
        if cores % v:
            raise ValueError(f"must divide cores ({cores}): each worker gets an equal share")
        return v


_NODE_MODELS: dict[str, type[BaseModel]] = {
    "local": LocalNodeConfig,
    "aws": AWSNodeConfig,
    "gcp": GCPNodeConfig,
    **{kind: BatchNodeConfig for kind in BATCH_SYSTEMS},
}


class NodeType(_Strict):
    """One entry of ``available_node_types``."""

    node_config: dict[str, Any] = {}
    resources: dict[str, float] = {}
    min_workers: int | None = Field(default=None, ge=0)
    max_workers: int | None = Field(default=None, ge=0)


class ClusterConfig(_Strict):
    """A whole cluster file. ``node_config`` values are checked per provider after this."""

    cluster_name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=63)
    provider: ProviderConfig
    min_workers: int = Field(default=0, ge=0)
    max_workers: int = Field(ge=0)
    available_node_types: dict[str, NodeType]
    head_node_type: str
    setup_commands: list[str] = []
    docker_image: str | None = None
    worker_command: list[str] | None = None
    idle_timeout_minutes: float | None = Field(default=None, gt=0)

    @field_validator("max_workers")
    @classmethod
    def _max_at_least_min(cls, v: int, info: Any) -> int:
        lo = info.data.get("min_workers", 0)
        if v < lo:
            raise ValueError(f"must be >= min_workers ({lo})")
        return v

    @property
    def worker_type_name(self) -> str:
        """The one node type that is not the head."""
        (name,) = [n for n in self.available_node_types if n != self.head_node_type]
        return name

    @property
    def head(self) -> NodeType:
        """The head node type's settings."""
        return self.available_node_types[self.head_node_type]

    @property
    def worker(self) -> NodeType:
        """The worker node type's settings."""
        return self.available_node_types[self.worker_type_name]

    def node_config(self, node_type: str) -> Any:
        """The typed ``node_config`` of ``node_type`` for this provider."""
        model = _NODE_MODELS[self.provider.type]
        return model.model_validate(self.available_node_types[node_type].node_config)

    @property
    def adaptive(self) -> bool:
        """Whether the cluster scales between ``min_workers`` and ``max_workers``."""
        return self.max_workers > self.min_workers


def _format_errors(err: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    parts = []
    for e in err.errors():
        path = ".".join(str(p) for p in (*prefix, *e["loc"]))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "missing required key"
        parts.append(f"{path}: {msg}" if path else msg)
    return "; ".join(parts)


def parse_cluster_config(data: Any, source: str = "<cluster file>") -> ClusterConfig:
    """Validate a loaded cluster file; raise :class:`ClusterConfigError` naming the bad key."""
    if not isinstance(data, dict):
        raise ClusterConfigError(f"{source}: expected a mapping at the top, got {type(data).__name__}")
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as e:
        raise ClusterConfigError(f"{source}: {_format_errors(e)}") from None
    if config.head_node_type not in config.available_node_types:
        raise ClusterConfigError(
            f"{source}: head_node_type: {config.head_node_type!r} is not one of "
            f"available_node_types ({', '.join(config.available_node_types)})"
        )
    workers = [n for n in config.available_node_types if n != config.head_node_type]
    if len(workers) != 1:
        raise ClusterConfigError(
            f"{source}: available_node_types: expected exactly one worker node type besides "
            f"{config.head_node_type!r}, got {len(workers)}"
        )
    for name in config.available_node_types:
        try:
            config.node_config(name)
        except ValidationError as e:
            loc = ("available_node_types", name, "node_config")
            raise ClusterConfigError(f"{source}: {_format_errors(e, loc)}") from None
    if config.provider.type == "aws":
        for name in config.available_node_types:
            if not config.node_config(name).SecurityGroupIds:
                # dask-cloudprovider would try to create a default group, which fails on
                # most accounts (and never has the right ports); ask for one instead.
                raise ClusterConfigError(
                    f"{source}: available_node_types.{name}.node_config.SecurityGroupIds: "
                    "required for aws (a group allowing ports 8786-8787 between the nodes)"
                )
        if not config.provider.region:
            raise ClusterConfigError(f"{source}: provider.region: required for aws")
    if config.provider.type == "gcp":
        for key in ("project_id", "zone"):
            if not getattr(config.provider, key):
                raise ClusterConfigError(f"{source}: provider.{key}: required for gcp")
    return config


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster YAML file."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ClusterConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as e:
        raise ClusterConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_cluster_config(data, source=path)
