"""Ray's ``ray.tune.schedulers.pb2`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._pb2 import PB2

__all__ = ["PB2"]
