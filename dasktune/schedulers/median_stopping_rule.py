"""Ray's ``ray.tune.schedulers.median_stopping_rule`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._median_stopping import MedianStoppingRule

__all__ = ["MedianStoppingRule"]
