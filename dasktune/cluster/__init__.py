"""Clusters from a YAML file: the model, and local / AWS / GCP / batch-system providers.

``get_provider(config)`` picks the provider for ``provider.type``; cloud providers import
dask-cloudprovider only when used (``pip install "dask-cloudprovider[aws,gcp]"``), batch
systems (Slurm, PBS, SGE, LSF) dask-jobqueue (``pip install "dasktune[hpc]"``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dasktune.cluster._base import ClusterProvider
    from dasktune.cluster.config import ClusterConfig

# Names load on first use (PEP 562): the workers' plugins import cluster.walltime and
# cluster.retire, and a trial's first fit() must not pay for pydantic, yaml and the
# providers (about 0.5 s) that only the cluster CLI needs.
_LAZY = {
    "ClusterProvider": "dasktune.cluster._base",
    "BATCH_SYSTEMS": "dasktune.cluster.config",
    "ClusterConfig": "dasktune.cluster.config",
    "ClusterConfigError": "dasktune.cluster.config",
    "load_cluster_config": "dasktune.cluster.config",
    "parse_cluster_config": "dasktune.cluster.config",
    "LocalProvider": "dasktune.cluster.local",
    "SpotInterruptionPlugin": "dasktune.cluster.spot",
    "ClusterState": "dasktune.cluster.state",
    "clusters_dir": "dasktune.cluster.state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dasktune.cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    from dasktune.cluster.config import BATCH_SYSTEMS

    if config.provider.type == "local":
        from dasktune.cluster.local import LocalProvider

        return LocalProvider(config, name)
    if config.provider.type in BATCH_SYSTEMS:
        from dasktune.cluster.batch import BatchProvider

        return BatchProvider(config, name)
    if config.provider.type == "aws":
        from dasktune.cluster.aws import AWSProvider

        return AWSProvider(config, name)
    from dasktune.cluster.gcp import GCPProvider

    return GCPProvider(config, name)
