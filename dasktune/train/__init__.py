"""Ray Train V2's public names, for trials that span several Dask workers.

``from ray import train`` becomes ``from dasktune import train`` (and
``ray.train.torch`` ``dasktune.train.torch``): a ``TorchTrainer`` runs the user's
``train_loop_per_worker`` on ``ScalingConfig(num_workers=N)`` ranks, each a process on
its own worker with ``torch.distributed`` set up, as one Tune trial. See
``docs/guides/multi-worker-trials.md``.

``RunConfig``, ``FailureConfig``, ``CheckpointConfig``, ``Checkpoint`` and ``Result``
are Tune's own (the same things).
"""

from __future__ import annotations

from dasktune.checkpoint import Checkpoint
from dasktune.config import CheckpointConfig, FailureConfig, RunConfig
from dasktune.results import Result
from dasktune.train.config import ScalingConfig, TrainingFailedError
from dasktune.train.context import (
    PreemptionInfo,
    TrainContext,
    get_checkpoint,
    get_context,
    get_preemption_info,
    report,
)

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "PreemptionInfo", "Result",
           "RunConfig", "ScalingConfig", "TrainContext", "TrainingFailedError",
           "get_checkpoint", "get_context", "get_preemption_info", "report"]
