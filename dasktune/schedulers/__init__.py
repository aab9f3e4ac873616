"""Trial schedulers (Ray's ``ray.tune.schedulers``): pure deciders over trials and results.

``dasktune.schedulers.X`` is ``ray.tune.schedulers.X``, with the same constructor arguments.
See :mod:`dasktune.schedulers._base` for the contract between a scheduler and the driver.
"""

from __future__ import annotations

from typing import Any

from dasktune._names import resolve_short_name
from dasktune.schedulers._async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from dasktune.schedulers._base import (
    Decision,
    Exploit,
    PolicyLine,
    Reconfigure,
    SchedulerContext,
    TrialScheduler,
)
from dasktune.schedulers._fifo import FIFOScheduler
from dasktune.schedulers._hb_bohb import HyperBandForBOHB
from dasktune.schedulers._hyperband import HyperBandScheduler
from dasktune.schedulers._median_stopping import MedianStoppingRule
from dasktune.schedulers._pb2 import PB2
from dasktune.schedulers._pbt import PopulationBasedTraining
from dasktune.schedulers._pbt_replay import PopulationBasedTrainingReplay
from dasktune.schedulers._resource_changing import ResourceChangingScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "Decision",
    "Exploit",
    "FIFOScheduler",
    "HyperBandForBOHB",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PB2",
    "PolicyLine",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "Reconfigure",
    "ResourceChangingScheduler",
    "SchedulerContext",
    "TrialScheduler",
    "create_scheduler",
]

# Ray's names for create_scheduler.
SCHEDULER_IMPORT: dict[str, type[TrialScheduler]] = {
    "fifo": FIFOScheduler,
    "async_hyperband": AsyncHyperBandScheduler,
    "asynchyperband": AsyncHyperBandScheduler,
    "median_stopping_rule": MedianStoppingRule,
    "medianstopping": MedianStoppingRule,
    "hyperband": HyperBandScheduler,
    "hb_bohb": HyperBandForBOHB,
    "pbt": PopulationBasedTraining,
    "pbt_replay": PopulationBasedTrainingReplay,
    "pb2": PB2,
    "resource_changing": ResourceChangingScheduler,
}
# Ray's names that dasktune does not provide: none today (kept for create_scheduler's message).
_UNAVAILABLE: tuple[str, ...] = ()


def create_scheduler(scheduler: str, **kwargs: Any) -> TrialScheduler:
    """Build a scheduler from its Ray short name, e.g. ``create_scheduler("async_hyperband",
    metric="loss", mode="min")``."""
    key = resolve_short_name("create_scheduler", "scheduler", scheduler, SCHEDULER_IMPORT,
                             _UNAVAILABLE)
    return SCHEDULER_IMPORT[key](**kwargs)
