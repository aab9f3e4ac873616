"""Ray's ``ray.tune.schedulers.pbt`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._pbt import PopulationBasedTraining
from dasktune.schedulers._pbt_replay import PopulationBasedTrainingReplay

__all__ = ["PopulationBasedTraining", "PopulationBasedTrainingReplay"]
