"""Builds the parts a :class:`~dasktune.Tuner` wires together, and checks input early.

Everything here runs before the first trial starts, so a mistake (an unpicklable
trainable, a metric/mode conflict, a private local path on a multi-host cluster)
is raised by ``fit()`` before any work is spent.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import uuid
from typing import TYPE_CHECKING, Any

import cloudpickle

from dasktune import _dask_config
from dasktune.logger import DEFAULT_LOGGERS
from dasktune.policy_log import PBTPolicyLogger
from dasktune.progress import ProgressReporter
from dasktune.trainable import is_class_trainable, unwrap
from dasktune.trial_notices import TrialNotices

if TYPE_CHECKING:
    from dasktune.callback import Callback
    from dasktune.config import CheckpointConfig, RunConfig, TuneConfig
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm
    from dasktune.storage import ExperimentStorage

logger = logging.getLogger(__name__)


def _copy(obj: Any) -> Any:
    """A fresh copy per fit() (Ray copies too), or the object itself if it holds
    something uncopyable (e.g. a sampler's lock)."""
    import copy

    try:
        return copy.deepcopy(obj)
    except Exception:  # noqa: BLE001
        return obj


def make_search_alg(tc: TuneConfig, param_space: dict[str, Any], uid: str) -> SearchAlgorithm:
    """The search algorithm the driver drives: ``BasicVariantGenerator`` by default,
    any ``Searcher`` wrapped in a ``SearchGenerator`` (which counts ``num_samples``)."""

    # Imported on first use, as dasktune/__init__ does: ``import dasktune`` stays light.
    from dasktune.search import BasicVariantGenerator, SearchAlgorithm, Searcher, SearchGenerator

    alg = _copy(tc.search_alg) if tc.search_alg is not None else None
    if alg is None:
        alg = BasicVariantGenerator(random_state=tc.seed)
    elif isinstance(alg, Searcher):
        alg = SearchGenerator(alg, tc.num_samples)
    elif not isinstance(alg, SearchAlgorithm):
        raise TypeError(
            f"TuneConfig(search_alg=...) must be a dasktune Searcher or SearchAlgorithm, "
            f"got {type(alg).__name__}"
        )
    spec: dict[str, Any] = {"num_samples": tc.num_samples, "experiment_uid": uid}
    if tc.seed is not None:
        spec["seed"] = tc.seed
    if not alg.set_search_properties(tc.metric, tc.mode, param_space, **spec):
        raise ValueError(
            f"the search algorithm {type(alg).__name__} already has a metric/mode that "
            f"disagrees with TuneConfig(metric={tc.metric!r}, mode={tc.mode!r}); set them in "
            "one place"
        )
    return alg


def check_checkpoint_config(trainable: Any, checkpoint_config: CheckpointConfig | None) -> None:
    """Ray refuses frequency/at-end checkpointing for a function trainable: only a
    ``Trainable`` class can be asked to save; a function reports its own checkpoints."""
    core, _, _ = unwrap(trainable)
    cc = checkpoint_config
    if cc is None or is_class_trainable(core):
        return
    for option, value in (("checkpoint_frequency", cc.checkpoint_frequency),
                          ("checkpoint_at_end", cc.checkpoint_at_end)):
        if value:
            raise ValueError(
                f"CheckpointConfig({option}={value!r}) is only supported for class trainables "
                f"(dasktune.Trainable); the function trainable "
                f"{getattr(core, '__name__', core)!r} must save its own checkpoints with "
                "tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(...))"
            )


def _created_name(creator: Any, trial: Any, option: str, folder: bool) -> str:
    name = creator(trial)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"TuneConfig({option}=...) must return a non-empty str, got {name!r}")
    if folder and ("/" in name or "\\" in name or name in (".", "..")):
        raise ValueError(
            f"TuneConfig({option}=...) returned {name!r}: a folder name, without path separators"
        )
    return name


def apply_name_creators(trial: Any, tc: TuneConfig | None) -> None:
    """Set a new trial's name and folder name from ``trial_name_creator`` /
    ``trial_dirname_creator`` (each called with the trial, as in Ray)."""
    if tc is None:
        return
    if tc.trial_name_creator is not None:
        trial.custom_trial_name = _created_name(tc.trial_name_creator, trial,
                                                "trial_name_creator", folder=False)
    if tc.trial_dirname_creator is not None:
        trial.custom_dirname = _created_name(tc.trial_dirname_creator, trial,
                                             "trial_dirname_creator", folder=True)


def make_scheduler(tc: TuneConfig) -> TrialScheduler:

    # Imported on first use, as dasktune/__init__ does: ``import dasktune`` stays light.
    from dasktune.schedulers import FIFOScheduler, TrialScheduler

    sched = _copy(tc.scheduler) if tc.scheduler is not None else FIFOScheduler()
    if not isinstance(sched, TrialScheduler):
        raise TypeError(f"TuneConfig(scheduler=...) must be a dasktune TrialScheduler, got "
                        f"{type(sched).__name__}")
    metric = tc.metric if not isinstance(tc.metric, list) else None
    mode = tc.mode if not isinstance(tc.mode, list) else None
    if not sched.set_search_properties(metric, mode):
        # Ray's rule and words (tune.run): set in one place, even when the two agree.
        raise ValueError(
            f"You passed a `metric` or `mode` argument to `TuneConfig` (metric={tc.metric!r}, "
            f"mode={tc.mode!r}), but the scheduler you are using ({type(sched).__name__}) was "
            f"already instantiated with its own `metric` and `mode` parameters "
            f"(metric={sched.metric!r}, mode={sched.mode!r}). Either remove the arguments from "
            "your scheduler or from `TuneConfig`."
        )
    if tc.reuse_actors and not sched.allows_reuse_actors:
        # Ray's words; Ray raises in fit(), this is before anything is written.
        raise ValueError(f"{type(sched).__name__} cannot be used with `reuse_actors=True`. "
                         "FIX THIS by setting `reuse_actors=False` in `tune.TuneConfig()`.")
    return sched


def make_callbacks(rc: RunConfig, client: Any, storage: ExperimentStorage, name: str,
                   tc: TuneConfig, search_alg: Any, scheduler: Any) -> list[Callback]:
    """User callbacks, plus the default loggers (unless the user passed their own
    instance of a class), PBT's policy log and the dashboard feed."""
    callbacks = list(rc.callbacks or [])
    callbacks.append(PBTPolicyLogger())  # writes nothing unless PBT exploits with log_config
    if rc.verbose is None or rc.verbose >= 1:  # Ray prints trial errors from verbosity 1
        callbacks.append(TrialNotices())
    # The default JSON/CSV/TensorBoard loggers (Ray's TUNE_DISABLE_AUTO_CALLBACK_LOGGERS).
    if _dask_config.get("default-loggers"):
        for cls in DEFAULT_LOGGERS:
            if not any(isinstance(cb, cls) for cb in callbacks):
                callbacks.append(cls())
    try:
        from dasktune.dashboard import DashboardCallback, register_dashboard

        url = register_dashboard(client)
        info = {"experiment_id": f"{name}-{uuid.uuid4().hex[:6]}", "name": name,
                "storage": storage.uri, "searcher": type(search_alg).__name__,
                "scheduler": type(scheduler).__name__, "metric": tc.metric, "mode": tc.mode}
        callbacks.append(DashboardCallback(client, info))
        if url:
            logger.info("dasktune dashboard: %s", url)
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - monitoring must never stop an experiment
        logger.warning("dashboard not available: %r", exc)
    return callbacks


def make_reporter(rc: RunConfig, tc: TuneConfig) -> Any:
    if rc.progress_reporter is not None:
        reporter = rc.progress_reporter
        if hasattr(reporter, "set_search_properties"):  # Ray: TuneConfig's metric/mode
            reporter.set_search_properties(tc.metric, tc.mode)
        return reporter
    verbose = 1 if rc.verbose is None else rc.verbose
    if verbose == 0:
        return None
    metric = tc.metric if isinstance(tc.metric, str) else None
    mode = tc.mode if isinstance(tc.mode, str) else None
    return ProgressReporter(verbose=verbose, metric=metric, mode=mode)


def ship_by_value(trainable: Any) -> None:
    """Send a trainable defined in the user's own files by value, not by import path.

    Workers cannot import a module that lives only next to the user's script (Ray
    ships a working dir for that); pickling it by value makes it run unchanged.
    Installed packages keep being imported by name.
    """
    import site
    import sys
    import sysconfig

    core, _, _ = unwrap(trainable)
    module = sys.modules.get(getattr(core, "__module__", None) or "")
    if module is None or module.__name__ in ("__main__", "builtins"):
        return
    if module.__name__.split(".")[0] == "dasktune":
        return
    path = getattr(module, "__file__", None)
    if not path:
        return
    path = os.path.realpath(path)
    installed = {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages(),
                 sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]}
    if any(path.startswith(root + os.sep) for root in installed):
        return
    cloudpickle.register_pickle_by_value(module)


def check_serializable(trainable: Any) -> None:
    """Fail at ``fit()`` if the trainable cannot travel to the workers, naming what."""
    ship_by_value(trainable)
    try:
        cloudpickle.dumps(trainable)
    except Exception as exc:
        culprit = _find_unpicklable(trainable)
        where = f" (the culprit: {culprit})" if culprit else ""
        raise TypeError(
            f"the trainable {getattr(trainable, '__name__', trainable)!r} cannot be serialized "
            f"to send it to the workers{where}: {type(exc).__name__}: {exc}"
        ) from None


def _find_unpicklable(obj: Any, depth: int = 0) -> str | None:
    """Walk closures, globals and attributes to name the object that fails to pickle."""
    import inspect

    if depth > 3:
        return None
    candidates: list[tuple[str, Any]] = []
    core, params, _ = unwrap(obj) if depth == 0 else (obj, {}, None)
    candidates += [(f"with_parameters({k}=...)", v) for k, v in params.items()]
    if inspect.isfunction(core):
        closure = core.__closure__ or ()
        candidates += [(f"closure variable {n!r}", c.cell_contents)
                       for n, c in zip(core.__code__.co_freevars, closure)]
        candidates += [(f"global {n!r}", core.__globals__[n]) for n in core.__code__.co_names
                       if n in core.__globals__ and not inspect.ismodule(core.__globals__[n])]
    elif hasattr(core, "__dict__") and not inspect.isclass(core):
        candidates += [(f"attribute {k!r}", v) for k, v in vars(core).items()]
    for label, value in candidates:
        try:
            cloudpickle.dump(value, io.BytesIO())
        except Exception:  # noqa: BLE001
            deeper = _find_unpicklable(value, depth + 1)
            return f"{label} of type {type(value).__name__}" + (f" -> {deeper}" if deeper else "")
    return None


def scatter_params(client: Any, trainable: Any) -> dict[str, Any]:
    """Ship ``with_parameters`` objects to the cluster once, as futures."""
    _, params, _ = unwrap(trainable)
    if not params:
        return {}
    futures = {}
    for key, value in params.items():
        try:
            pickle.dumps(value, protocol=5)
        except Exception:  # noqa: BLE001 - cloudpickle handles the rest when scattering
            pass
        futures[key] = client.scatter(value, broadcast=False, hash=False)
    return futures


def cluster_can_scale(cluster: Any, client: Any) -> bool:
    """Whether the cluster may add workers (adaptive or a manager that can scale): a
    cluster object of this process, or a scheduler that says so in its metadata
    (``["dasktune", "adaptive"]``, set by the adaptive local provider)."""
    cluster = cluster or getattr(client, "cluster", None)
    if cluster is None:
        try:
            return bool(client.get_metadata(["dasktune", "adaptive"], default=None))
        except Exception:  # noqa: BLE001 - an old scheduler: assume a fixed size
            return False
    adaptive = getattr(cluster, "_adaptive", None)
    if adaptive is not None:
        return True
    return bool(getattr(cluster, "dasktune_can_scale", False))


def open_path_check(client: Any, storage: ExperimentStorage) -> Any:
    """For a local ``storage_path``: a :class:`~dasktune.shared_path.SharedPathCheck`
    that every current worker passed (else ValueError), kept for workers that join
    later; None for remote storage. The caller closes it."""
    if not storage.is_local:
        return None
    from dasktune.shared_path import SharedPathCheck  # speaks Dask: imported on use

    check = SharedPathCheck(client, storage)
    blind = check.blind()
    if blind:
        check.close()
        raise ValueError(check.refusal(blind))
    return check


def check_shared_storage(client: Any, storage: ExperimentStorage) -> None:
    """Refuse a local path that some worker host cannot see (unless it is shared)."""
    check = open_path_check(client, storage)
    if check is not None:
        check.close()
