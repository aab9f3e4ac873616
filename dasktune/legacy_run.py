"""``tune.run(...)``: Ray's legacy entry point, as wiring over :class:`~dasktune.Tuner`.

Ray still documents ``tune.run`` and most scripts and answers found online use it. Here
it only translates its keyword arguments into ``TuneConfig`` / ``RunConfig`` /
``CheckpointConfig`` / ``FailureConfig``, maps ``resume`` onto ``Tuner.restore``, runs
``Tuner.fit()`` (the one driver path) and returns an
:class:`~dasktune.analysis.ExperimentAnalysis` of the experiment.
"""

from __future__ import annotations

import copy
import datetime
import logging
import os
import posixpath
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dasktune import registry
from dasktune.analysis import ExperimentAnalysis
from dasktune.config import CheckpointConfig, FailureConfig, RunConfig, TuneConfig
from dasktune.metric_mode import MODES
from dasktune.results import TuneError
from dasktune.schedulers import create_scheduler
from dasktune.search import create_searcher
from dasktune.trainable import with_resources
from dasktune.trial import TERMINATED
from dasktune.tuner import Tuner

logger = logging.getLogger(__name__)

_RESUME_SUFFIXES = {  # Ray's "+..." suffixes -> Tuner.restore's flags
    "ERRORED": {"resume_errored": True},
    "RESTART_ERRORED": {"restart_errored": True},
    "ERRORED_ONLY": {"resume_unfinished": False, "resume_errored": True},
    "RESTART_ERRORED_ONLY": {"resume_unfinished": False, "restart_errored": True},
}


def resume_flags(resume: bool | str | None) -> dict[str, bool] | None:
    """``tune.run(resume=...)`` as ``Tuner.restore`` flags, or None for a fresh start.

    As Ray 2.60: ``False``/``None`` start afresh; ``True`` or ``"AUTO"`` continue the
    experiment if there is one, each optionally suffixed ``+ERRORED``,
    ``+RESTART_ERRORED``, ``+ERRORED_ONLY`` or ``+RESTART_ERRORED_ONLY``. Ray's removed
    modes (``"LOCAL"``, ``"REMOTE"``, ``"PROMPT"``, a bare ``"ERRORED_ONLY"``) raise.
    """
    if resume is None or resume is False:
        return None
    if resume is True:
        return {}
    if not isinstance(resume, str):
        raise TypeError(f"resume must be True, False or a string like 'AUTO', got {resume!r}")
    head, *suffixes = resume.split("+")
    if head in ("LOCAL", "REMOTE", "PROMPT", "ERRORED_ONLY"):
        raise DeprecationWarning(
            f"'{head}' is deprecated. Please pass in one of (True, False, 'AUTO')"
            + (" (with a suffix, e.g. 'AUTO+ERRORED_ONLY')." if head == "ERRORED_ONLY" else ".")
        )
    if head != "AUTO":
        raise ValueError(f"Invalid resume setting: {resume!r} (True, False or 'AUTO', "
                         f"optionally with a suffix: {', '.join('+' + s for s in _RESUME_SUFFIXES)})")
    flags: dict[str, bool] = {}
    for suffix in suffixes:
        if suffix not in _RESUME_SUFFIXES:
            raise ValueError(f"Invalid resume setting: '{suffix}'")
        flags = dict(_RESUME_SUFFIXES[suffix])  # as Ray: the last suffix wins
    return flags


def _checkpoint_config(base: CheckpointConfig | None, keep_checkpoints_num: int | None,
                       checkpoint_score_attr: str | None, checkpoint_freq: int,
                       checkpoint_at_end: bool) -> CheckpointConfig:
    """Ray's deprecated checkpoint arguments folded into a copy of ``checkpoint_config``."""
    cc = copy.copy(base) if base is not None else CheckpointConfig()

    def deprecated(old: str, new: str) -> None:
        warnings.warn(f"{old} is deprecated and will be removed. use checkpoint_config.{new} "
                      "instead.", DeprecationWarning, stacklevel=3)

    if keep_checkpoints_num is not None:
        deprecated("keep_checkpoints_num", "num_to_keep")
        cc.num_to_keep = keep_checkpoints_num
    if checkpoint_score_attr is not None:
        deprecated("checkpoint_score_attr", "checkpoint_score_attribute")
        if checkpoint_score_attr.startswith("min-"):  # Ray's old prefix form
            cc.checkpoint_score_attribute = checkpoint_score_attr[4:]
            cc.checkpoint_score_order = "min"
        else:
            cc.checkpoint_score_attribute = checkpoint_score_attr.removeprefix("max-")
            cc.checkpoint_score_order = "max"
    if checkpoint_freq > 0:
        deprecated("checkpoint_freq", "checkpoint_frequency")
        cc.checkpoint_frequency = checkpoint_freq
    if checkpoint_at_end:
        deprecated("checkpoint_at_end", "checkpoint_at_end")
        cc.checkpoint_at_end = True
    cc.__post_init__()  # the folded values are checked as the config's own
    return cc


def run(
    run_or_experiment: str | Callable[..., Any] | type,
    *,
    name: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping[str, Any] | Callable[[str, Mapping[str, Any]], bool] | Any = None,
    time_budget_s: float | datetime.timedelta | None = None,
    config: dict[str, Any] | None = None,
    resources_per_trial: Mapping[str, Any] | None = None,
    num_samples: int = 1,
    storage_path: str | None = None,
    storage_filesystem: Any = None,
    search_alg: Any = None,
    scheduler: Any = None,
    checkpoint_config: CheckpointConfig | None = None,
    verbose: int | None = None,
    progress_reporter: Any = None,
    log_to_file: bool | str = False,
    trial_name_creator: Callable[[Any], str] | None = None,
    trial_dirname_creator: Callable[[Any], str] | None = None,
    sync_config: Any = None,
    export_formats: Sequence[str] | None = None,
    max_failures: int = 0,
    fail_fast: bool | str = False,
    restore: str | None = None,
    resume: bool | str | None = None,
    reuse_actors: bool = False,
    raise_on_failed_trial: bool = True,
    callbacks: Sequence[Any] | None = None,
    max_concurrent_trials: int | None = None,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = False,
    local_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ExperimentAnalysis:
    """Run an experiment to the end (Ray's ``tune.run``) and return its analysis.

    The arguments are Ray 2.60's (see its documentation); each lands where ``Tuner``
    takes it: ``config`` is the ``param_space``, ``resources_per_trial`` wraps the
    trainable with ``tune.with_resources``, the deprecated ``checkpoint_freq``,
    ``checkpoint_at_end``, ``keep_checkpoints_num`` and ``checkpoint_score_attr`` fill
    a ``CheckpointConfig``. ``resume=True``/``"AUTO"`` (+ Ray's suffixes) continue the
    experiment at ``storage_path/name`` with ``Tuner.restore`` when there is one, else
    start it. With ``raise_on_failed_trial`` (the default) a trial that did not finish
    raises :class:`~dasktune.TuneError` after the run. ``storage_options`` (dasktune's)
    are as in ``RunConfig``.
    """
    if mode and mode not in MODES:  # Ray's words, the one list of modes
        raise ValueError("The `mode` parameter passed to `tune.run(...)` must be one of "
                         "['min', 'max']")
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ValueError("The `config` passed to `tune.run(...)` must be a dict. "
                         f"Got '{type(config)}' instead.")
    if local_dir is not None:
        raise DeprecationWarning("The `local_dir` argument is deprecated. You should set the "
                                 "`storage_path` instead.")
    if restore is not None:
        raise ValueError("tune.run(restore=<checkpoint>) is not supported: report the "
                         "checkpoint to start from in the config, or continue an experiment "
                         "with resume=True (or tune.Tuner.restore)")
    if isinstance(run_or_experiment, (list, tuple)):
        raise TypeError("tune.run takes one trainable (a function, a Trainable class or a "
                        "registered name), not a list of experiments")
    if fail_fast and max_failures != 0:
        raise ValueError("max_failures must be 0 if fail_fast=True.")
    if export_formats:
        logger.warning("tune.run(export_formats=%r) is ignored: checkpoints are the "
                       "trainable's own files", export_formats)
    flags = resume_flags(resume)

    trainable = run_or_experiment
    if resources_per_trial is not None:
        if isinstance(trainable, str):
            trainable = registry.get_trainable(trainable)
        trainable = with_resources(trainable, resources_per_trial)
    if isinstance(search_alg, str):
        search_alg = create_searcher(search_alg)
    if isinstance(scheduler, str):
        scheduler = create_scheduler(scheduler)

    tune_config = TuneConfig(
        metric=metric, mode=mode, search_alg=search_alg, scheduler=scheduler,
        num_samples=num_samples, max_concurrent_trials=max_concurrent_trials,
        time_budget_s=time_budget_s, reuse_actors=reuse_actors,
        trial_name_creator=trial_name_creator, trial_dirname_creator=trial_dirname_creator)
    run_config = RunConfig(
        name=name, storage_path=storage_path, storage_filesystem=storage_filesystem,
        storage_options=storage_options, callbacks=list(callbacks or []), stop=stop,
        failure_config=FailureConfig(max_failures=max_failures, fail_fast=fail_fast),
        checkpoint_config=_checkpoint_config(checkpoint_config, keep_checkpoints_num,
                                             checkpoint_score_attr, checkpoint_freq,
                                             checkpoint_at_end),
        verbose=verbose, progress_reporter=progress_reporter, log_to_file=log_to_file,
        sync_config=sync_config)

    tuner = None
    if flags is not None and name:
        path = posixpath.join(_expanded(run_config.resolved_storage_path), name)
        if Tuner.can_restore(path, storage_filesystem, storage_options):
            logger.info("Resuming the experiment at %s; its config is the one saved "
                        "(a new `config` is ignored, as in Ray)", path)
            tuner = Tuner.restore(path, trainable, storage_filesystem=storage_filesystem,
                                  storage_options=storage_options, **flags)
    if tuner is None:
        if flags is not None and not name:
            logger.warning("tune.run(resume=%r) without a `name` starts a new experiment "
                           "(the default name is new each time)", resume)
        elif flags is not None:
            logger.info("No experiment to resume at %s/%s: starting a new one",
                        run_config.resolved_storage_path, name)
        tuner = Tuner(trainable, param_space=config, tune_config=tune_config,
                      run_config=run_config)
    results = tuner.fit()

    analysis = ExperimentAnalysis(results.experiment_path, storage_filesystem=results.filesystem,
                                  default_metric=metric, default_mode=mode)
    incomplete = [t for t in analysis.trials if t.status != TERMINATED]
    if incomplete:
        if raise_on_failed_trial:
            raise TuneError(f"Trials did not complete: {[str(t) for t in incomplete]}")
        logger.error("Trials did not complete: %s", [str(t) for t in incomplete])
    return analysis


def _expanded(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))
