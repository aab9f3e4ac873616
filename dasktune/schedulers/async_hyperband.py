"""Ray's ``ray.tune.schedulers.async_hyperband`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._async_hyperband import ASHAScheduler, AsyncHyperBandScheduler

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]
