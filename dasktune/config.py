"""``TuneConfig``, ``RunConfig``, ``CheckpointConfig``, ``FailureConfig``: validated dataclasses.

Names, fields and defaults follow Ray Tune's. Validation that needs nothing but the
values happens in ``__post_init__``, so a mistake is raised where it is written.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dasktune.callback import Callback
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm, Searcher


def _check_mode(mode: Any, where: str) -> None:
    modes = mode if isinstance(mode, (list, tuple)) else [mode]
    for m in modes:
        if m not in (None, "min", "max"):
            raise ValueError(f"{where}: mode must be 'min' or 'max', got {m!r}")


@dataclass
class TuneConfig:
    """What to tune for and how many trials to run (Ray's ``tune.TuneConfig``)."""

    metric: str | list[str] | None = None
    mode: Literal["min", "max"] | list[str] | None = None
    search_alg: Searcher | SearchAlgorithm | None = None
    scheduler: TrialScheduler | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | datetime.timedelta | None = None
    reuse_actors: bool = False
    trial_name_creator: Callable[[Any], str] | None = None
    trial_dirname_creator: Callable[[Any], str] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_mode(self.mode, "TuneConfig")
        # Ray allows mode without metric (a scheduler or searcher may carry the metric).
        if isinstance(self.metric, (list, tuple)) != isinstance(self.mode, (list, tuple)):
            if self.mode is not None and self.metric is not None:
                raise ValueError("TuneConfig: metric and mode must both be lists or both strings")
        if isinstance(self.metric, (list, tuple)) and len(self.metric) != len(self.mode or []):
            raise ValueError("TuneConfig: metric and mode lists differ in length")
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool):
            raise TypeError(f"TuneConfig: num_samples must be an int, got {self.num_samples!r}")
        if self.num_samples == -1:
            pass  # infinite: the time budget or a stopper must end it (checked at fit())
        elif self.num_samples < 1:
            raise ValueError(
                f"TuneConfig: num_samples must be >= 1 (or -1 for unlimited), got {self.num_samples}"
            )
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ValueError(
                f"TuneConfig: max_concurrent_trials must be >= 1, got {self.max_concurrent_trials}"
            )
        if isinstance(self.time_budget_s, datetime.timedelta):  # Ray accepts one
            self.time_budget_s = self.time_budget_s.total_seconds()
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"TuneConfig: time_budget_s must be > 0, got {self.time_budget_s}")


@dataclass
class CheckpointConfig:
    """Checkpoint retention and frequency (Ray's ``tune.CheckpointConfig``)."""

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["min", "max"] = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and self.num_to_keep < 1:
            raise ValueError(
                f"CheckpointConfig: num_to_keep must be None or >= 1, got {self.num_to_keep}"
            )
        if self.checkpoint_score_order not in ("min", "max"):
            raise ValueError(
                "CheckpointConfig: checkpoint_score_order must be 'min' or 'max', "
                f"got {self.checkpoint_score_order!r}"
            )
        if self.checkpoint_frequency < 0:
            raise ValueError("CheckpointConfig: checkpoint_frequency must be >= 0")


@dataclass
class FailureConfig:
    """How trial failures are handled (Ray's ``tune.FailureConfig``).

    ``max_failures`` counts errors raised by user code (``-1``: retry forever).
    Lost workers are infrastructure, not the trial's fault: they are retried up to
    ``max_worker_losses`` times (``-1``, the default, means without limit).
    ``fail_fast=True`` stops the experiment at the first trial error;
    ``fail_fast="raise"`` re-raises the trial's exception from ``fit()``.
    """

    max_failures: int = 0
    fail_fast: bool | str = False
    max_worker_losses: int = -1

    def __post_init__(self) -> None:
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(
                f"FailureConfig: fail_fast must be True, False or 'raise', got {self.fail_fast!r}"
            )
        if self.max_failures < -1:
            raise ValueError("FailureConfig: max_failures must be >= -1")


@dataclass
class RunConfig:
    """Where results go and when trials stop (Ray's ``tune.RunConfig``).

    ``storage_path`` is any fsspec URL or local path (default ``~/dasktune_results``);
    ``storage_filesystem`` an ``fsspec`` filesystem to use for it, or ``storage_options``
    the keyword arguments to build one (e.g. an S3 ``endpoint_url``).
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    storage_options: dict[str, Any] | None = None
    callbacks: list[Callback] | None = None
    stop: Any = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    verbose: int | None = None
    progress_reporter: Any = None
    log_to_file: bool | str = False
    sync_config: Any = None  # accepted for Ray compatibility; storage is written directly

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"RunConfig: name must be a non-empty string, got {self.name!r}")
        if self.name and ("/" in self.name or "\\" in self.name):
            raise ValueError(f"RunConfig: name must not contain a path separator: {self.name!r}")
        if self.verbose is not None and self.verbose not in (0, 1, 2, 3):
            raise ValueError(f"RunConfig: verbose must be 0, 1, 2 or 3, got {self.verbose!r}")
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.callbacks is None:
            self.callbacks = []

    @property
    def resolved_storage_path(self) -> str:
        path = self.storage_path or os.environ.get("DASKTUNE_RESULTS_DIR") or "~/dasktune_results"
        return path

