"""dasktune: Ray Tune's API for hyperparameter tuning, running on Dask.

``import dasktune as tune`` in place of ``from ray import tune``; ``dasktune.init`` /
``dasktune.shutdown`` in place of ``ray.init`` / ``ray.shutdown``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dasktune import _dask_config  # noqa: F401  (registers the dasktune: config section)

if TYPE_CHECKING:
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
    from dasktune.progress_reporter import (
        CLIReporter,
        JupyterNotebookReporter,
        ProgressReporter,
    )
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

# Each public name's module, imported on first use of the name: a process that needs
# one corner of dasktune (a training rank imports ``dasktune.train``; a worker imports
# the actor) does not pay for the rest (the tuner, the driver, distributed's client).
_EXPORTS = {
    **dict.fromkeys(["Callback"], "callback"),
    **dict.fromkeys(["Checkpoint"], "checkpoint"),
    **dict.fromkeys(["CheckpointConfig", "FailureConfig", "PlacementGroupFactory",
                     "RunConfig", "SyncConfig", "TuneConfig"], "config"),
    **dict.fromkeys(["CLIReporter", "JupyterNotebookReporter", "ProgressReporter"],
                    "progress_reporter"),
    **dict.fromkeys(["register_trainable"], "registry"),
    **dict.fromkeys(["Result", "ResultGrid", "TuneError"], "results"),
    **dict.fromkeys(["init", "is_initialized", "shutdown"], "runtime"),
    **dict.fromkeys(["get_checkpoint", "get_context", "report"], "session"),
    **dict.fromkeys(["choice", "grid_search", "lograndint", "loguniform", "qlograndint",
                     "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn",
                     "sample_from", "uniform"], "space"),
    **dict.fromkeys(["Stopper"], "stopper"),
    **dict.fromkeys(["Trainable", "with_parameters", "with_resources"], "trainable"),
    **dict.fromkeys(["Tuner"], "tuner"),
    # Ray's legacy API (``tune.run``, ``tune.ExperimentAnalysis``): it brings the
    # searchers and schedulers along.
    **dict.fromkeys(["run"], "legacy_run"),
    **dict.fromkeys(["ExperimentAnalysis"], "analysis"),
}
# Ray's submodules reached as attributes (``tune.schedulers.ASHAScheduler``) without
# ``import dasktune.schedulers``, also imported on first use.
_SUBMODULES = frozenset({
    "analysis", "callback", "checkpoint", "experiment", "logger", "progress", "result",
    "results", "registry", "schedulers", "search", "stopper", "trainable", "tuner", "utils",
})


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"dasktune.{_EXPORTS[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"dasktune.{name}")
    else:
        raise AttributeError(f"module 'dasktune' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES | set(_EXPORTS))

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
