"""``Tuner``: validates the user's input and wires the parts together. Nothing else.

``Tuner(...).fit()`` builds the experiment store, the search algorithm, the
scheduler, the executor on the resolved Dask client and the callbacks, then hands
them to :class:`~dasktune.driver.TuneController`. ``Tuner.restore`` rebuilds
the same from an experiment's saved state (``experiment.py``).
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from dasktune import experiment, registry, tuner_build
from dasktune.config import RunConfig, TuneConfig
from dasktune.driver.gang_queue import split_gang_request
from dasktune.results import ResultGrid
from dasktune.space import leaves, path_str, validate_param_space
from dasktune.storage import ExperimentStorage
from dasktune.trainable import (
    is_class_trainable,
    trainable_name,
    unwrap,
    validate_trainable,
)
from dasktune.trial import Trial

logger = logging.getLogger(__name__)


class Tuner:
    """Tune a trainable over a parameter space (Ray Tune's ``tune.Tuner``).

    Args:
        trainable: a function ``f(config)`` that calls ``tune.report``, or a
            :class:`~dasktune.Trainable` subclass; optionally wrapped by
            ``tune.with_resources`` / ``tune.with_parameters``; or the name it was given
            with ``tune.register_trainable``.
        param_space: the search space: a dict of constants, domains
            (``tune.uniform(...)``) and ``tune.grid_search([...])``, nested freely.
        tune_config: what to optimise and how many trials.
        run_config: where results go, when trials stop, failure handling.

    Constructing a Tuner creates the experiment's folder and writes its ``tuner.pkl``
    (as Ray does), so :meth:`can_restore` is True for it from then on.
    """

    def __init__(self, trainable: Any = None, *, param_space: Mapping[str, Any] | None = None,
                 tune_config: TuneConfig | None = None, run_config: RunConfig | None = None,
                 _restored: experiment.RestoredExperiment | None = None):
        if trainable is None:
            raise TypeError("Tuner needs a trainable (a function or a dasktune.Trainable class)")
        name = None
        if isinstance(trainable, str):  # registered by name; the experiment's name keeps it
            name, trainable = trainable, registry.get_trainable(trainable)
        validate_trainable(trainable)
        self._trainable_name = name or trainable_name(trainable)
        if param_space is not None:
            validate_param_space(param_space)
        if tune_config is not None and not isinstance(tune_config, TuneConfig):
            raise TypeError(f"tune_config must be a dasktune.TuneConfig, got {type(tune_config)}")
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError(f"run_config must be a dasktune.RunConfig, got {type(run_config)}")
        self._trainable = trainable
        self._param_space = dict(param_space or {})
        self._tune_config = tune_config or TuneConfig()
        self._run_config = run_config or RunConfig()
        self._restored = _restored
        self._results: ResultGrid | None = None
        # Ray's refusal of a metric or mode set both on the scheduler and in TuneConfig,
        # made here so that nothing is written for a Tuner that cannot run.
        tuner_build.make_scheduler(self._tune_config)
        if _restored is not None:
            _check_restored_matches(_restored, self._trainable_name, param_space)
            self._results = _restored.result_grid()
            self._name, self._uid = _restored.storage.name, _restored.uid
        else:
            # As Ray, the experiment's folder and tuner.pkl are written now: from here
            # on Tuner.can_restore(path) is True, before fit() ran.
            self._name = self._run_config.name or self._default_name()
            self._uid = uuid.uuid4().hex[:8]
            storage = self._storage(self._name)
            storage.check_writable()  # an unwritable path is named now, not a raw OSError
            self._state_writer(storage).write_static()

    # ------------------------------------------------------------------ fit
    def fit(self) -> ResultGrid:
        """Run the experiment to the end and return its results."""
        from dasktune import runtime
        from dasktune.driver import ExperimentPlan, TuneController
        from dasktune.execution.dask_executor import DaskExecutor
        from dasktune.stopper import make_stopper

        tc, rc = self._tune_config, self._run_config
        name = self._name
        storage = self._storage(name)
        tuner_build.check_serializable(self._trainable)
        if tc.num_samples == -1 and tc.time_budget_s is None and rc.stop is None:
            raise ValueError("TuneConfig(num_samples=-1) runs forever: set time_budget_s or a "
                             "RunConfig(stop=...) that ends the experiment")
        stopper, stop_dict = make_stopper(rc.stop)
        restored = self._restored
        uid = self._uid
        if restored is not None:
            search_alg, scheduler = restored.search_alg, restored.scheduler
            trials: list[Trial] = restored.trials
        else:
            search_alg = tuner_build.make_search_alg(tc, self._param_space, uid)
            scheduler = tuner_build.make_scheduler(tc)
            trials = []
        storage.check_writable()
        client, cluster = runtime.get_client()
        path_check = tuner_build.open_path_check(client, storage)
        executor = DaskExecutor(client, path_check=path_check)
        executor.watch_cluster()
        params = tuner_build.scatter_params(client, self._trainable)
        callbacks = tuner_build.make_callbacks(rc, client, storage, name, tc, search_alg,
                                              scheduler)
        state_writer = self._state_writer(storage)
        core, _, _ = unwrap(self._trainable)
        plan = ExperimentPlan(
            trainable=core,
            trainable_name=self._trainable_name,
            storage=storage,
            tune_config=tc,
            failure_config=rc.failure_config,  # type: ignore[arg-type]
            checkpoint_config=rc.checkpoint_config,  # type: ignore[arg-type]
            stopper=stopper,
            stop_dict=stop_dict,
            resources_for=self._resources_for(),
            params=params,
            can_scale=tuner_build.cluster_can_scale(cluster, client),
            name_trial=lambda trial: tuner_build.apply_name_creators(trial, tc),
            gang_shape=split_gang_request(unwrap(self._trainable)[2])[1],
        )
        controller = TuneController(plan, search_alg, scheduler, executor, callbacks,
                                    trials=trials, save_state=state_writer,
                                    reporter=tuner_build.make_reporter(rc, tc),
                                    ended_unheard=restored.ended_unheard if restored else ())
        state_writer.write_static()
        try:
            # Before the first trial exists, so a bad option costs no work (Ray: at fit()).
            tuner_build.check_checkpoint_config(core, rc.checkpoint_config)
            controller.run()
        finally:
            for fut in params.values():
                fut.release()
            if path_check is not None:
                path_check.close()
        cc = rc.checkpoint_config
        self._results = ResultGrid(controller.trials, storage, metric=tc.metric, mode=tc.mode,
                                   score_attr=cc.checkpoint_score_attribute if cc else None,
                                   score_order=cc.checkpoint_score_order if cc else "max")
        return self._results

    def get_results(self) -> ResultGrid:
        """The results of the last ``fit()`` or of the restored experiment, without running."""
        if self._results is None:
            raise RuntimeError("no results yet: call fit() first (or Tuner.restore(...))")
        return self._results

    # ------------------------------------------------------------------ restore
    @classmethod
    def restore(cls, path: str | os.PathLike[str], trainable: Any, resume_unfinished: bool = True,
                resume_errored: bool = False, restart_errored: bool = False,
                param_space: Mapping[str, Any] | None = None,
                storage_filesystem: Any = None,
                storage_options: dict[str, Any] | None = None,
                _resume_config: Any = None) -> Tuner:
        """Continue an experiment from its folder or URI (Ray's ``Tuner.restore``).

        Finished trials are not run again; unfinished ones continue from their newest
        committed checkpoint; errored ones stay errored unless ``resume_errored``
        (continue from the checkpoint) or ``restart_errored`` (start from scratch).
        The searcher's state continues; ``num_samples`` counts trials already made.
        Both ``resume_errored`` and ``restart_errored``: errored trials resume (as Ray).

        As Ray, ``trainable`` must have the original's name and ``param_space`` (given to
        refresh objects, not to tune new ones) the original's keys: else ValueError.
        An experiment whose Tuner was constructed but never fit starts afresh.

        ``storage_filesystem`` (fsspec's or a ``pyarrow.fs.FileSystem``) or
        ``storage_options`` (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``) reach the
        storage at ``path``; when neither is given,
        the ``storage_options`` saved with the experiment (without credentials) are used.
        """
        restored = experiment.load(os.fspath(path), storage_filesystem=storage_filesystem,
                                   storage_options=storage_options,
                                   resume_unfinished=resume_unfinished,
                                   resume_errored=resume_errored,
                                   restart_errored=restart_errored)
        space = dict(param_space) if param_space is not None else restored.param_space
        return cls(trainable, param_space=space, tune_config=restored.tune_config,
                   run_config=restored.run_config, _restored=restored)

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str], storage_filesystem: Any = None,
                    storage_options: dict[str, Any] | None = None) -> bool:
        """Whether ``path`` holds an experiment that :meth:`restore` can continue: True as
        soon as a ``Tuner`` was constructed there (as Ray). ``storage_filesystem`` is
        fsspec's or a ``pyarrow.fs.FileSystem``."""
        return experiment.can_restore(os.fspath(path), storage_filesystem, storage_options)

    # ------------------------------------------------------------------ helpers
    def _default_name(self) -> str:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        return f"{self._trainable_name}_{stamp}"

    def _state_writer(self, storage: ExperimentStorage) -> experiment.StateWriter:
        return experiment.StateWriter(storage, name=self._name, uid=self._uid,
                                      trainable_name=self._trainable_name,
                                      tune_config=self._tune_config,
                                      run_config=self._run_config,
                                      param_space=self._param_space)

    def _storage(self, name: str) -> ExperimentStorage:
        if self._restored is not None:
            return self._restored.storage
        rc = self._run_config
        return ExperimentStorage(rc.resolved_storage_path, name, filesystem=rc.storage_filesystem,
                                 storage_options=rc.storage_options)

    def _resources_for(self) -> Callable[[dict[str, Any]], dict[str, float]]:
        from dasktune.resources import normalize_request

        core, _, request = unwrap(self._trainable)
        if request is None and is_class_trainable(core):
            request = core.default_resource_request
        request, _ = split_gang_request(request)

        def resources_for(config: dict[str, Any]) -> dict[str, float]:
            req = request(config) if callable(request) else request
            return normalize_request(req or None)

        if not callable(request):
            resources_for({})  # a bad request is an error now, not on the first trial
        return resources_for


def _space_keys(space: Mapping[str, Any]) -> list[str]:
    return sorted(path_str(path) for path, _ in leaves(dict(space)))


def _check_restored_matches(restored: experiment.RestoredExperiment, trainable_name: str,
                            param_space: Mapping[str, Any] | None) -> None:
    """Ray's checks on ``Tuner.restore``'s arguments: the same trainable (by name), and a
    ``param_space`` with the original's keys (it may refresh values, not add new ones)."""
    if restored.trainable_name and trainable_name != restored.trainable_name:
        raise ValueError(
            "Invalid `trainable` input to `Tuner.restore()`. To fix this error, pass in the "
            "same trainable that was used to initialize the Tuner. Got a trainable with "
            f"identifier '{trainable_name}' but expected '{restored.trainable_name}'."
        )
    if param_space is None or param_space is restored.param_space:
        return
    got, expected = _space_keys(param_space), _space_keys(restored.param_space)
    if got != expected:
        raise ValueError(
            "Invalid `param_space` input to `Tuner.restore()`. To fix this error, pass in "
            "the same `param_space` that was used to initialize the Tuner. Only re-specify "
            "the `param_space` to refresh objects that cannot be saved with the experiment; "
            "it should not be used to introduce new hyperparameters to tune."
            f"\n\nGot: {got}\nExpected: {expected}"
        )
