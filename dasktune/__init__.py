"""dasktune: Ray Tune's API for hyperparameter tuning, running on Dask.

``import dasktune as tune`` in place of ``from ray import tune``; ``dasktune.init`` /
``dasktune.shutdown`` in place of ``ray.init`` / ``ray.shutdown``.
"""

from __future__ import annotations

import importlib
from typing import Any

from dasktune import _dask_config  # noqa: F401  (registers the dasktune: config section)
from dasktune.callback import Callback
from dasktune.checkpoint import Checkpoint
from dasktune.config import (
    CheckpointConfig,
    FailureConfig,
    PlacementGroupFactory,
    RunConfig,
    SyncConfig,
    TuneConfig,
)
from dasktune.progress_reporter import CLIReporter, JupyterNotebookReporter, ProgressReporter
from dasktune.registry import register_trainable
from dasktune.results import Result, ResultGrid, TuneError
from dasktune.runtime import init, is_initialized, shutdown
from dasktune.session import get_checkpoint, get_context, report
from dasktune.space import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from dasktune.stopper import Stopper
from dasktune.trainable import Trainable, with_parameters, with_resources
from dasktune.tuner import Tuner

__version__ = "0.1.0"

# Ray's submodules reached as attributes (``tune.schedulers.ASHAScheduler``) without
# ``import dasktune.schedulers``: imported on first use, so ``import dasktune`` stays light.
_SUBMODULES = frozenset({
    "analysis", "callback", "checkpoint", "experiment", "logger", "progress", "result",
    "results", "registry", "schedulers", "search", "stopper", "trainable", "tuner", "utils",
})
# Ray's legacy API (``tune.run``, ``tune.ExperimentAnalysis``), loaded on first use: it
# brings the searchers and schedulers along.
_LAZY = {"run": "dasktune.legacy_run", "ExperimentAnalysis": "dasktune.analysis"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        module = importlib.import_module(f"dasktune.{name}")
        globals()[name] = module
        return module
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dasktune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES | set(_LAZY))

__all__ = [
    "CLIReporter", "Callback", "Checkpoint", "CheckpointConfig", "ExperimentAnalysis",
    "FailureConfig",
    "JupyterNotebookReporter", "PlacementGroupFactory", "ProgressReporter", "Result",
    "ResultGrid", "RunConfig", "Stopper", "SyncConfig", "Trainable", "TuneConfig", "TuneError",
    "Tuner", "choice",
    "get_checkpoint", "get_context", "grid_search", "init", "is_initialized", "lograndint",
    "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform", "randint",
    "randn", "register_trainable", "report", "run", "sample_from", "shutdown", "uniform", "with_parameters",
    "with_resources",
]
