"""Clusters from a YAML file: the model, and local / AWS / GCP / batch-system providers.

``get_provider(config)`` picks the provider for ``provider.type``; cloud providers import
dask-cloudprovider only when used (``pip install "dask-cloudprovider[aws,gcp]"``), batch
systems (Slurm, PBS, SGE, LSF) dask-jobqueue (``pip install "dasktune[hpc]"``).
"""

from __future__ import annotations

from dasktune.cluster._base import ClusterProvider
from dasktune.cluster.config import (
    BATCH_SYSTEMS,
    ClusterConfig,
    ClusterConfigError,
    load_cluster_config,
    parse_cluster_config,
)
from dasktune.cluster.local import LocalProvider
from dasktune.cluster.spot import SpotInterruptionPlugin
from dasktune.cluster.state import ClusterState, clusters_dir

__all__ = [
    "ClusterConfig",
    "ClusterConfigError",
    "ClusterProvider",
    "ClusterState",
    "LocalProvider",
    "SpotInterruptionPlugin",
    "clusters_dir",
    "get_provider",
    "load_cluster_config",
    "parse_cluster_config",
]


def get_provider(config: ClusterConfig, name: str | None = None) -> ClusterProvider:
    """The provider object for ``config`` (``name`` overrides ``cluster_name``)."""
    if config.provider.type == "local":
        return LocalProvider(config, name)
    if config.provider.type in BATCH_SYSTEMS:
        from dasktune.cluster.batch import BatchProvider

        return BatchProvider(config, name)
    if config.provider.type == "aws":
        from dasktune.cluster.aws import AWSProvider

        return AWSProvider(config, name)
    from dasktune.cluster.gcp import GCPProvider

    return GCPProvider(config, name)
