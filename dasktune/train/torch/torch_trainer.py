"""``TorchTrainer``: data-parallel PyTorch training on several Dask workers, as one Tune
trial (Ray Train V2's ``ray.train.torch.TorchTrainer``).

``fit()`` inside a Tune trial (the trainable is then Ray's "driver function") runs the
trial's worker group through :class:`~dasktune.train.controller.TrainController`;
outside Tune it runs a one-trial Tuner whose driver function does the same, so
placement, storage, checkpoints and restarts are those of any trial, and returns that
trial's :class:`~dasktune.Result` (raising ``TrainingFailedError`` if it failed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dasktune import runtime
from dasktune.config import FailureConfig, RunConfig
from dasktune.integration.ray_train import TuneReportCallback
from dasktune.results import Result
from dasktune.session import current_session
from dasktune.train import forkserver
from dasktune.train.config import ScalingConfig, TrainingFailedError
from dasktune.train.controller import TrainController
from dasktune.trainable import with_resources
from dasktune.tuner import Tuner
from dasktune.tuner_build import ship_by_value

__all__ = ["TorchConfig", "TorchTrainer"]


@dataclass
class TorchConfig:
    """The process group's settings (Ray's ``TorchConfig``): ``backend`` None picks nccl
    with GPUs and gloo without; ``timeout_s`` bounds each collective."""

    backend: str | None = None
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig: backend must be 'gloo', 'nccl' or None, "
                             f"got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"TorchConfig: timeout_s must be > 0, got {self.timeout_s}")


class TorchTrainer:
    """Runs ``train_loop_per_worker(train_loop_config)`` on ``scaling_config.num_workers``
    ranks with ``torch.distributed`` set up (see the module docs).

    ``run_config``: ``name``/``storage_path`` (outside Tune), ``failure_config``
    (restarts of the worker group), ``checkpoint_config`` (retention, outside Tune),
    ``callbacks`` (``TuneReportCallback`` inside Tune).
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: dict[str, Any] | None = None,
                 torch_config: TorchConfig | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None,
                 datasets: dict[str, Any] | None = None,
                 **ray_options: Any):
        if not callable(train_loop_per_worker):
            raise TypeError("TorchTrainer: train_loop_per_worker must be a function, got "
                            f"{type(train_loop_per_worker).__name__}")
        if datasets:
            raise ValueError("TorchTrainer: datasets (Ray Data) are not supported by "
                             "dasktune; load the data in train_loop_per_worker (e.g. with "
                             "prepare_data_loader, or dask.dataframe)")
        unknown = set(ray_options) - {"dataset_config", "metadata", "resume_from_checkpoint"}
        if unknown:
            raise TypeError(f"TorchTrainer got unexpected keyword argument(s) "
                            f"{sorted(unknown)}")
        if ray_options.get("resume_from_checkpoint") is not None:
            raise ValueError("TorchTrainer: resume_from_checkpoint was removed in Ray Train "
                             "V2; restore through RunConfig(name=...) / tune.get_checkpoint")
        for name, value, cls in (("scaling_config", scaling_config, ScalingConfig),
                                 ("run_config", run_config, RunConfig),
                                 ("torch_config", torch_config, TorchConfig)):
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"TorchTrainer: {name} must be a dasktune.train."
                                f"{cls.__name__}, got {type(value).__name__}")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.torch_config = torch_config or TorchConfig()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()

    def fit(self) -> Result:
        """Train; the trial's result (rank 0's last metrics, the newest checkpoint, the
        trial's folder). Raises ``TrainingFailedError`` when training failed."""
        session = current_session()
        if session is None:
            return self._fit_outside_tune()
        forward = any(isinstance(cb, TuneReportCallback)
                      for cb in self.run_config.callbacks or [])
        return self._controller(session, forward).run()

    def _controller(self, session: Any, forward: bool) -> TrainController:
        return TrainController(self.train_loop_per_worker, self.train_loop_config,
                               self.scaling_config, self.run_config, session, forward,
                               backend=self.torch_config.backend,
                               timeout_s=self.torch_config.timeout_s)

    def _fit_outside_tune(self) -> Result:
        trainer = self

        def train_driver(config: dict[str, Any]) -> None:
            trainer._controller(current_session(), forward=True).run()

        # The workers import torch for the ranks while the experiment starts.
        forkserver.warm_cluster(runtime.get_client()[0], gpus=self.scaling_config.uses_gpu)
        ship_by_value(self.train_loop_per_worker)  # the driver ships it inside itself
        rc = self.run_config
        run_config = dataclasses.replace(
            rc,
            # The trainer's max_failures restart its group; a lost driver is retried as
            # any trial whose worker was lost.
            failure_config=FailureConfig(max_failures=0),
            callbacks=[cb for cb in rc.callbacks or []
                       if not isinstance(cb, TuneReportCallback)],
            verbose=0 if rc.verbose is None else rc.verbose)
        # The head and the gang reserved up front, Ray's bundles (head first).
        grid = Tuner(with_resources(train_driver, self.scaling_config),
                     run_config=run_config).fit()
        result = grid[0]
        if result.error is not None:
            raise TrainingFailedError(f"Training failed: {result.error}") from result.error
        return result
