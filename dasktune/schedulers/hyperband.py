"""Ray's ``ray.tune.schedulers.hyperband`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._hyperband import HyperBandScheduler

__all__ = ["HyperBandScheduler"]
