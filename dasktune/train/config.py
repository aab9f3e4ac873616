"""``ScalingConfig``: how many training workers a multi-worker trial runs, and what each
reserves (Ray Train V2's ``ray.train.ScalingConfig``); and ``TrainingFailedError``.

``RunConfig``, ``FailureConfig`` and ``CheckpointConfig`` are Tune's own classes
(:mod:`dasktune.config`): the same fields mean the same things for a trainer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any

from dasktune.config import PlacementGroupFactory

__all__ = ["ScalingConfig", "TrainingFailedError"]

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class TrainingFailedError(RuntimeError):
    """``TorchTrainer.fit()`` failed: a rank raised, or the worker group was lost more
    often than ``FailureConfig(max_failures)`` allows (Ray's ``ray.train.TrainingFailedError``).

    Inside a Tune trial it ends the trial's attempt, so the Tune run's own
    ``FailureConfig`` decides whether the trial is tried again.
    """


@dataclass
class ScalingConfig:
    """The training workers of one trial (Ray Train V2's ``ScalingConfig``).

    Args:
        num_workers: training processes (ranks), each on a worker process of its own.
        use_gpu: one GPU per rank (``resources_per_worker`` may ask for another count).
        resources_per_worker: what each rank reserves; default ``{"CPU": 1}``, or
            ``{"GPU": 1}`` with ``use_gpu`` (Ray's defaults).
        placement_strategy: ``"PACK"`` (ranks on as few machines as possible) or
            ``"SPREAD"`` (on as many), or their ``STRICT_`` forms.
        trainer_resources: what the driver function itself reserves (bundle 0);
            default ``{"CPU": 0}``, as Ray V2's controller takes no CPU.
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    trainer_resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) \
                or self.num_workers < 1:
            raise ValueError("ScalingConfig: num_workers must be an int >= 1, got "
                             f"{self.num_workers!r} (elastic (min, max) ranges are not "
                             "supported)")
        if self.placement_strategy not in _STRATEGIES:
            raise ValueError(f"ScalingConfig: placement_strategy must be one of "
                             f"{', '.join(_STRATEGIES)}, got {self.placement_strategy!r}")
        for name in ("resources_per_worker", "trainer_resources"):
            value = getattr(self, name)
            if value is not None:
                _check_bundle(name, value)
        if self.use_gpu and self.resources_per_worker is not None and \
                not self.resources_per_worker.get("GPU"):
            raise ValueError("ScalingConfig: use_gpu=True, but resources_per_worker "
                             f"{self.resources_per_worker!r} asks for no GPU")

    @property
    def worker_resources(self) -> dict[str, float]:
        """What one rank reserves."""
        if self.resources_per_worker is None:
            return {"GPU": 1.0} if self.use_gpu else {"CPU": 1.0}
        return {k: float(v) for k, v in self.resources_per_worker.items() if v}

    @property
    def head_resources(self) -> dict[str, float]:
        """What the driver function reserves (bundle 0)."""
        if self.trainer_resources is None:
            return {"CPU": 0.0}
        return {k: float(v) for k, v in self.trainer_resources.items()}

    @property
    def uses_gpu(self) -> bool:
        """Whether each rank gets a GPU (``use_gpu`` or a GPU in its resources)."""
        return bool(self.use_gpu or self.worker_resources.get("GPU"))

    def worker_bundles(self) -> list[dict[str, float]]:
        """One bundle per rank, rank 0 first."""
        return [dict(self.worker_resources) for _ in range(self.num_workers)]

    def as_placement_group_factory(self) -> PlacementGroupFactory:
        """The trial's resources as Ray's bundles: bundle 0 the driver function (the
        head), then one per rank, with :attr:`placement_strategy`."""
        return PlacementGroupFactory([self.head_resources, *self.worker_bundles()],
                                     strategy=self.placement_strategy)

    @property
    def total_resources(self) -> dict[str, float]:
        """Everything the trial reserves, summed (Ray's attribute)."""
        return dict(self.as_placement_group_factory().required_resources)


def _check_bundle(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"ScalingConfig: {name} must be a dict, got {value!r}")
    for key, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, Real) or \
                not math.isfinite(amount) or amount < 0:
            raise ValueError(f"ScalingConfig: {name}[{key!r}] must be a finite number >= 0, "
                             f"got {amount!r}")
