"""``TuneConfig``, ``RunConfig``, ``CheckpointConfig``, ``FailureConfig``, ``SyncConfig``:
validated dataclasses; and ``PlacementGroupFactory``, Ray's way to ask for a trial's resources.

Names, fields and defaults follow Ray Tune's. Validation that needs nothing but the
values happens in ``__post_init__``, so a mistake is raised where it is written.
"""

from __future__ import annotations

import datetime
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any, Literal

from dasktune import _dask_config
from dasktune.metric_mode import check_metric_mode, check_mode

if TYPE_CHECKING:
    from dasktune.callback import Callback
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm, Searcher


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
        # Ray allows mode without metric (a scheduler or searcher may carry the metric).
        check_metric_mode(self.metric, self.mode, "TuneConfig")
        if isinstance(self.metric, (list, tuple)) and self.mode is None:
            raise ValueError("TuneConfig: a list of metrics needs a list of modes")
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool):
            raise TypeError(f"TuneConfig: num_samples must be an int, got {self.num_samples!r}")
        if self.num_samples == -1:
            pass  # infinite: the time budget or a stopper must end it (checked at fit())
        elif self.num_samples < 1:
            raise ValueError(
                f"TuneConfig: num_samples must be >= 1 (or -1 for unlimited), got {self.num_samples}"
            )
        if self.max_concurrent_trials is not None:
            if not isinstance(self.max_concurrent_trials, int) or \
                    isinstance(self.max_concurrent_trials, bool) or self.max_concurrent_trials < 0:
                raise ValueError("TuneConfig: max_concurrent_trials must be an int >= 0 (0: no "
                                 f"limit), got {self.max_concurrent_trials!r}")
            if self.max_concurrent_trials == 0:  # Ray: None or 0 means no limit
                self.max_concurrent_trials = None
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
        check_mode(self.checkpoint_score_order, "CheckpointConfig", allow_none=False,
                   name="checkpoint_score_order")
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


# Option names already warned about, so a script building configs in a loop warns once.
_SYNC_WARNED: set[str] = set()


@dataclass
class SyncConfig:
    """Accepted for Ray compatibility (Ray's ``tune.SyncConfig``); syncing has no effect.

    dasktune writes results, experiment state and checkpoints straight to
    ``RunConfig.storage_path`` (any fsspec store) instead of syncing a local copy, so
    ``sync_period``, ``sync_timeout`` and ``sync_artifacts_on_checkpoint`` change nothing.
    ``sync_artifacts=True`` warns once: files a trial writes to
    ``get_context().get_trial_dir()`` are in storage only when storage is local; with a
    remote store, put them in a checkpoint. ``upload_dir``/``syncer`` (removed from Ray)
    warn once too.
    """

    sync_period: float = 300
    sync_timeout: float = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True
    upload_dir: str | None = None
    syncer: Any = None
    sync_on_checkpoint: bool | None = None

    def __post_init__(self) -> None:
        for name in ("sync_period", "sync_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or value < 0:
                raise ValueError(f"SyncConfig: {name} must be a number >= 0, got {value!r}")
        if self.sync_artifacts:
            _warn_sync_once(
                "sync_artifacts",
                "SyncConfig(sync_artifacts=True) has no effect in dasktune: files written to "
                "get_context().get_trial_dir() reach storage only when storage_path is local; "
                "with a remote store, save them in a checkpoint (tune.report(..., "
                "checkpoint=...)).",
            )
        for name in ("upload_dir", "syncer", "sync_on_checkpoint"):
            if getattr(self, name) is not None:
                _warn_sync_once(
                    name,
                    f"SyncConfig({name}=...) is ignored (Ray removed it): dasktune writes "
                    "straight to RunConfig(storage_path=...); set the destination there.",
                )


def _warn_sync_once(option: str, message: str) -> None:
    if option in _SYNC_WARNED:
        return
    _SYNC_WARNED.add(option)
    warnings.warn(message, UserWarning, stacklevel=4)


_PG_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementGroupFactory(Mapping[str, float]):
    """A trial's resources as Ray's bundles: ``PlacementGroupFactory([{"CPU": 2, "GPU": 1},
    {"CPU": 1}])`` (Ray's ``tune.PlacementGroupFactory``).

    A trial runs as one Dask actor on one worker, so the bundles' resources are summed
    (:attr:`required_resources`: ``{"CPU": 3.0, "GPU": 1.0}``) and the whole trial is
    placed where that sum fits, whatever ``strategy`` says. The factory reads as that
    summed dict, so ``tune.with_resources(train, pgf)`` and a Trainable's
    ``default_resource_request`` returning one work as with a plain dict.
    """

    def __init__(self, bundles: Sequence[Mapping[str, float]], strategy: str = "PACK",
                 *args: Any, **kwargs: Any) -> None:
        # *args/**kwargs: Ray forwards extra placement-group options; none apply to Dask
        if isinstance(bundles, Mapping) or not isinstance(bundles, Sequence) or not bundles:
            raise ValueError(
                f"PlacementGroupFactory needs a non-empty list of bundle dicts, got {bundles!r}"
            )
        for i, bundle in enumerate(bundles):
            if not isinstance(bundle, Mapping):
                raise ValueError(f"PlacementGroupFactory: bundle {i} must be a dict, got {bundle!r}")
            for key, value in bundle.items():
                if isinstance(value, bool) or not isinstance(value, Real) \
                        or not math.isfinite(value) or value < 0:
                    raise ValueError(
                        f"PlacementGroupFactory: bundle {i} resource {key!r} must be a finite "
                        f"number >= 0, got {value!r}"
                    )
        if strategy not in _PG_STRATEGIES:
            raise ValueError(
                f"PlacementGroupFactory: strategy must be one of {', '.join(_PG_STRATEGIES)}, "
                f"got {strategy!r}"
            )
        self.bundles: list[dict[str, float]] = [dict(b) for b in bundles]
        self.strategy = strategy

    @property
    def required_resources(self) -> dict[str, float]:
        """The sum of every bundle's resources (what the trial is placed with)."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + float(value)
        return total

    @property
    def head_bundle_is_empty(self) -> bool:
        """Whether the first bundle asks for nothing (Ray's attribute)."""
        return not any(self.bundles[0].values())

    def __getitem__(self, key: str) -> float:
        return self.required_resources[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.required_resources)

    def __len__(self) -> int:
        return len(self.required_resources)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlacementGroupFactory):
            return self.bundles == other.bundles and self.strategy == other.strategy
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((repr(self.bundles), self.strategy))

    def __repr__(self) -> str:
        return f"PlacementGroupFactory({self.bundles!r}, strategy={self.strategy!r})"


@dataclass
class RunConfig:
    """Where results go and when trials stop (Ray's ``tune.RunConfig``).

    ``storage_path`` is any fsspec URL or local path (default: the ``dasktune.storage-path``
    setting of ``dask.config``, ``~/dasktune_results`` as shipped);
    ``storage_filesystem`` an ``fsspec`` filesystem (or a ``pyarrow.fs.FileSystem``, as
    Ray takes) to use for it, or ``storage_options``
    the keyword arguments to build one (e.g. an S3 ``endpoint_url``).
    ``progress_reporter``: a ``tune.CLIReporter`` / ``tune.JupyterNotebookReporter`` (or
    a ``tune.ProgressReporter`` subclass) in place of the default table; ``verbose=0``
    silences it. ``sync_config``: a :class:`SyncConfig`, accepted and without effect, as
    storage is written directly.
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
    sync_config: SyncConfig | None = None  # accepted for Ray; storage is written directly

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
        if self.sync_config is None:
            self.sync_config = SyncConfig()
        elif not isinstance(self.sync_config, SyncConfig):
            raise TypeError(
                f"RunConfig: sync_config must be a tune.SyncConfig, got {self.sync_config!r}"
            )
        if self.progress_reporter is not None and not callable(
            getattr(self.progress_reporter, "maybe_report", None)
        ):
            raise TypeError(
                "RunConfig: progress_reporter must be a tune.CLIReporter, "
                f"tune.JupyterNotebookReporter or a tune.ProgressReporter, got "
                f"{self.progress_reporter!r}"
            )
        if self.verbose == 0 and self.progress_reporter is not None:
            self.progress_reporter.verbose = 0  # Ray: verbose=0 silences any reporter

    @property
    def resolved_storage_path(self) -> str:
        """``storage_path``, else the ``dasktune.storage-path`` setting (dasktune.yaml)."""
        return str(self.storage_path or _dask_config.get("storage-path"))

