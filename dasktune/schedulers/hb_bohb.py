"""Ray's ``ray.tune.schedulers.hb_bohb`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._hb_bohb import HyperBandForBOHB

__all__ = ["HyperBandForBOHB"]
