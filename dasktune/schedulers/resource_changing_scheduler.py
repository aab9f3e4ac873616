"""Ray's ``ray.tune.schedulers.resource_changing_scheduler`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._resource_changing import (
    DistributeResources,
    DistributeResourcesToTopJob,
    ResourceChangingScheduler,
)

__all__ = ["DistributeResources", "DistributeResourcesToTopJob", "ResourceChangingScheduler"]
