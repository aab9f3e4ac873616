"""Ray's ``ray.tune.schedulers.trial_scheduler`` path, for translated imports."""

from __future__ import annotations

from dasktune.schedulers._base import TrialScheduler
from dasktune.schedulers._fifo import FIFOScheduler

__all__ = ["FIFOScheduler", "TrialScheduler"]
