"""What the driver runs: an :class:`ExperimentPlan`, as the facade built it.

The facade (:class:`dasktune.Tuner`, :func:`dasktune.simulator.run_simulated`) turns the
user's arguments into one plan; the driver loop takes it with the deciders (searcher,
scheduler), an executor and the callbacks, and imports nothing of the facade.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dasktune.config import CheckpointConfig, FailureConfig, TuneConfig
    from dasktune.driver.gang_queue import GangShape
    from dasktune.stopper import Stopper
    from dasktune.storage import ExperimentStorage
    from dasktune.trial import Trial

__all__ = ["ExperimentPlan"]


@dataclass
class ExperimentPlan:
    """One experiment's fixed parts.

    Attributes:
        trainable: the user's function or class (unwrapped; pickled once by the driver).
        trainable_name: names the trial folders (``<name>_<trial>``).
        storage: the experiment's storage.
        tune_config: metric, mode, concurrency, time budget, ``reuse_actors``.
        failure_config, checkpoint_config: the run's (never None).
        stopper, stop_dict: from ``RunConfig(stop=...)`` (the dict also goes to trials).
        resources_for: a trial's resource request from its config.
        params: ``tune.with_parameters`` values, as futures on the cluster.
        can_scale: the cluster can grow for waiting trials (placement never refuses).
        name_trial: sets a new trial's custom names (``trial_name_creator``, ...).
        gang_shape: the workers each trial asks for besides its own slot, declared up
            front (``tune.with_resources(fn, ScalingConfig(...))``); reserved with it.
    """

    trainable: Any
    trainable_name: str
    storage: ExperimentStorage
    tune_config: TuneConfig
    failure_config: FailureConfig
    checkpoint_config: CheckpointConfig
    stopper: Stopper
    stop_dict: dict[str, Any] | None
    resources_for: Callable[[dict[str, Any]], dict[str, float]]
    params: dict[str, Any] = field(default_factory=dict)
    can_scale: bool = False
    name_trial: Callable[[Trial], None] | None = None
    gang_shape: GangShape | None = None
