"""Ray's ``ray.tune.execution.placement_groups`` path, for translated imports."""

from __future__ import annotations

from dasktune.config import PlacementGroupFactory

__all__ = ["PlacementGroupFactory"]
