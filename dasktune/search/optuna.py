"""``OptunaSearch``: Optuna's samplers behind the :class:`Searcher` contract (Ray's).

Trials are driven with Optuna's ask-and-tell interface: ``suggest`` asks, results are
``trial.report(value, step=training_iteration)`` (single objective), completion is ``tell``
with COMPLETE, FAIL (``error=True``) or PRUNED (the driver sets ``"__early_stopped__"`` in
the last result when a scheduler stopped the trial).

State: without a ``storage`` the in-memory study is pickled into :meth:`get_state`; with one,
the study lives there (optuna-dashboard can open it) and :meth:`set_state` reloads it by name.
Either way the restored study continues: trial numbers are never repeated, and trials in
flight at save time can still report and complete under their dasktune trial ids.

Over ~400 lines (about 440) because Ray's constructor surface (points to evaluate,
multi-objective, define-by-run spaces, storage) and the ask/tell bookkeeping that
restore needs share one study object; the space translation is :mod:`.optuna_space`'s.
"""

from __future__ import annotations

import io
import logging
import math
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from dasktune import space as sp
from dasktune.search._base import Searcher
from dasktune.search._inflight_tpe import InFlightTPESampler
from dasktune.search.optuna_space import optuna_plan

__all__ = ["InFlightTPESampler", "OptunaSearch"]

logger = logging.getLogger(__name__)

Space = Mapping[str, Any] | Callable[[optuna.Trial], dict | None]

# Lock types -> factories. Optuna's GA samplers (NSGA-II/III) hold a ``threading.Lock``,
# which no pickler accepts; a lock guards in-process state only, so a fresh one is its copy.
_LOCK_FACTORIES: dict[type, Callable[[], Any]] = {
    type(threading.Lock()): threading.Lock,
    type(threading.RLock()): threading.RLock,
}


class _LockSafePickler(cloudpickle.Pickler):
    """A cloudpickle Pickler that pickles thread locks as new, unlocked locks."""

    def reducer_override(self, obj: Any) -> Any:
        make = _LOCK_FACTORIES.get(type(obj))
        if make is not None:
            return make, ()
        return super().reducer_override(obj)


def _dumps(obj: Any) -> bytes:
    """cloudpickle ``obj``, locks included (see :class:`_LockSafePickler`)."""
    buf = io.BytesIO()
    _LockSafePickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
    return buf.getvalue()


class OptunaSearch(Searcher):
    """Search with an Optuna sampler (Ray's ``ray.tune.search.optuna.OptunaSearch``).

    Args:
        space: a dasktune param space (translated), a dict of Optuna distributions, or a
            define-by-run function ``f(trial) -> dict | None`` that calls
            ``trial.suggest_*``; the dict it returns (constants) is merged into the config.
            None: take the Tuner's ``param_space``.
        metric, mode: what to optimize; lists for multi-objective (e.g. NSGA-II).
        points_to_evaluate: configs to try first (enqueued in the study).
        sampler: an Optuna sampler. The default is Optuna's TPE with the constant liar (which
            keeps concurrent trials apart), searching ``24 × k`` EI candidates per ask while
            ``k`` trials are in flight (up to 8, :class:`InFlightTPESampler`); with one trial
            in flight it is exactly ``TPESampler(seed=seed)``.
        seed: the default sampler's seed.
        evaluated_rewards: results of ``points_to_evaluate`` already known; those points are
            added as completed trials instead of being run.
        storage: an Optuna storage or URL (``"sqlite:///study.db"``); a path without ``://``
            is a journal file. The study persists there.
        study_name: the study's name in ``storage`` (loaded if it exists).
    """

    def __init__(
        self,
        space: Space | None = None,
        metric: str | list[str] | None = None,
        mode: str | list[str] | None = None,
        points_to_evaluate: list[dict] | None = None,
        sampler: optuna.samplers.BaseSampler | None = None,
        seed: int | None = None,
        evaluated_rewards: list | None = None,
        storage: str | optuna.storages.BaseStorage | None = None,
        study_name: str | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler):
            raise TypeError(f"sampler must be an optuna sampler, got {type(sampler).__name__}")
        if sampler is not None and seed is not None:
            logger.warning("OptunaSearch: seed=%r is ignored since a sampler was given", seed)
        if evaluated_rewards is not None and (
            points_to_evaluate is None or len(evaluated_rewards) != len(points_to_evaluate)
        ):
            raise ValueError(
                "evaluated_rewards needs points_to_evaluate of the same length "
                f"(got {len(evaluated_rewards)} rewards for "
                f"{len(points_to_evaluate or [])} points)"
            )
        self._sampler = sampler
        self._seed = seed
        self._points = [dict(p) for p in points_to_evaluate or []]
        self._rewards = list(evaluated_rewards) if evaluated_rewards is not None else None
        self._storage = storage
        self._study_name = study_name
        self._study: optuna.Study | None = None
        self._ot_trials: dict[str, optuna.Trial] = {}
        self._completed: set[str] = set()
        self._func: Callable[[optuna.Trial], dict | None] | None = None
        self._dists: dict[str, BaseDistribution] | None = None
        self._paths: dict[str, tuple] = {}
        self._template: dict[str, Any] = {}
        self._space_from_config = False
        if space is not None:
            self._set_space(space)

    # -- space ------------------------------------------------------------------------

    @staticmethod
    def convert_search_space(spec: dict) -> dict[str, BaseDistribution]:
        """A param space as Optuna distributions keyed by ``"/"``-joined paths (Ray's).

        Constants are left out; ``grid_search``, ``sample_from`` and ``randn`` raise a
        ValueError naming the parameter.
        """
        return optuna_plan(spec)[0]

    @property
    def _has_space(self) -> bool:
        return self._func is not None or self._dists is not None

    def _set_space(self, space: Space) -> None:
        if callable(space) and not isinstance(space, Mapping):
            self._func = space
            return
        if not isinstance(space, Mapping):
            raise TypeError(
                "OptunaSearch space must be a dict (param space or Optuna distributions) or a "
                f"define-by-run function, got {type(space).__name__}"
            )
        dists, paths, _ = optuna_plan(space)
        if dists:  # constants alone are no search space
            self._dists, self._paths, self._template = dists, paths, dict(space)

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        """Take the Tuner's metric, mode and param space.

        Returns False if this searcher has its own space and ``config`` defines parameters
        as well, or if metric/mode contradict its own; constants-only configs are fine.
        """
        if not super().set_search_properties(metric, mode, config, **spec):
            return False
        config = config or {}
        if self._seed is None and self._sampler is None and self._study is None:
            self._seed = spec.get("seed")  # TuneConfig(seed=...) seeds the default sampler
        if self._has_space and not self._space_from_config:
            return not sp.has_unresolved_values(dict(config))
        self._set_space(dict(config))
        self._space_from_config = True  # a later call (a re-run) may bring a new param_space
        if not self._has_space:
            raise ValueError(
                "OptunaSearch has no search space: give OptunaSearch(space=...) or put "
                "parameters (tune.uniform, tune.choice, ...) in the Tuner's param_space"
            )
        return True

    # -- the study --------------------------------------------------------------------

    def _directions(self) -> dict[str, Any]:
        if isinstance(self._mode, (list, tuple)):
            return {"directions": ["minimize" if m == "min" else "maximize" for m in self._mode]}
        return {"direction": "minimize" if self._mode == "min" else "maximize"}

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        if self._sampler is not None:
            return self._sampler
        return InFlightTPESampler(seed=self._seed)

    def _resolved_storage(self) -> optuna.storages.BaseStorage | str | None:
        storage = self._storage
        if isinstance(storage, str) and "://" not in storage:
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(storage))
        return storage

    def _ensure_study(self) -> optuna.Study:
        if self._study is not None:
            return self._study
        if not self._has_space:
            raise RuntimeError(
                "OptunaSearch has no search space: pass space= or a param_space to the Tuner"
            )
        if self._metric is None or self._mode is None:
            raise RuntimeError(
                "OptunaSearch needs metric and mode: pass them to OptunaSearch or TuneConfig"
            )
        self._study = optuna.create_study(
            storage=self._resolved_storage(),
            sampler=self._make_sampler(),
            pruner=optuna.pruners.NopPruner(),
            study_name=self._study_name,
            load_if_exists=True,
            **self._directions(),
        )
        self._study_name = self._study.study_name
        self._seed_points()
        return self._study

    def _flat_point(self, point: Mapping[str, Any]) -> dict[str, Any]:
        flat = {sp.path_str(path): value for path, value in sp.leaves(point)}
        if self._dists is not None:
            unknown = sorted(set(flat) - set(self._dists))
            if unknown:
                raise ValueError(
                    f"points_to_evaluate: {', '.join(repr(u) for u in unknown)} not in the "
                    f"search space ({', '.join(sorted(self._dists))})"
                )
        return flat

    def _seed_points(self) -> None:
        assert self._study is not None
        if self._rewards is not None:
            for point, reward in zip(self._points, self._rewards, strict=True):
                self.add_evaluated_point(point, reward)
        else:
            for point in self._points:
                self._study.enqueue_trial(self._flat_point(point))
        self._points, self._rewards = [], None  # seeded once; a restored study has them

    # -- the Searcher hooks ----------------------------------------------------------

    def suggest(self, trial_id: str) -> dict | None | str:
        study = self._ensure_study()
        if trial_id not in self._ot_trials:
            if _grid_exhausted(study):
                return Searcher.FINISHED
            if self._func is not None:
                self._ot_trials[trial_id] = study.ask()
            else:
                self._ot_trials[trial_id] = study.ask(fixed_distributions=self._dists)
        ot_trial = self._ot_trials[trial_id]
        if self._func is not None:
            extra = self._func(ot_trial)
            if extra is not None and not isinstance(extra, Mapping):
                raise TypeError(
                    "the define-by-run function must return None or a dict of constants, got "
                    f"{type(extra).__name__}"
                )
            return _unnest_slashes({**ot_trial.params, **(extra or {})})
        config = sp.copy_containers(self._template)
        for name, value in ot_trial.params.items():
            sp.assign_path(config, self._paths[name], value)
        return _unnest_slashes(sp.restore_tuples(self._template, config))

    def _value(self, result: Mapping[str, Any], trial_id: str) -> float | list[float]:
        names = self._metric if isinstance(self._metric, (list, tuple)) else [self._metric]
        missing = [n for n in names if n not in result]
        if missing:
            raise ValueError(
                f"OptunaSearch: metric {', '.join(repr(m) for m in missing)} is not in the "
                f"result of trial {trial_id} (keys: {', '.join(sorted(map(str, result)))})"
            )
        values = [float(result[n]) for n in names]
        return values if isinstance(self._metric, (list, tuple)) else values[0]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self._metric, (list, tuple)):
            return  # Optuna has no intermediate values for multi-objective studies
        if trial_id in self._completed or trial_id not in self._ot_trials:
            return
        value = self._value(result, trial_id)
        ot_trial = self._ot_trials[trial_id]
        step = result.get("training_iteration")
        if step is None:  # number the reports ourselves
            study = self._ensure_study()
            step = len(study._storage.get_trial(ot_trial._trial_id).intermediate_values)
        if not math.isnan(value):  # Optuna rejects NaN intermediate values
            ot_trial.report(value, int(step))

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if trial_id in self._completed or trial_id not in self._ot_trials:
            return
        ot_trial = self._ot_trials[trial_id]
        values: Any = None
        if error:
            state = TrialState.FAIL
        elif result and result.get("__early_stopped__"):
            state = TrialState.PRUNED
        elif not result:  # the trial ended without reporting anything: no value to tell
            logger.warning("OptunaSearch: trial %s completed with no result; told FAIL", trial_id)
            state = TrialState.FAIL
        else:
            state = TrialState.COMPLETE
            values = self._value(result or {}, trial_id)
        try:
            self._ensure_study().tell(ot_trial, values, state=state)
        except RuntimeError as exc:
            # GridSampler calls study.stop() when its grid is done, which Optuna refuses
            # outside study.optimize; the trial is stored by then and suggest() says FINISHED
            if "Study.stop" not in str(exc):
                raise
        self._completed.add(trial_id)

    def add_evaluated_point(
        self,
        parameters: dict,
        value: float | list[float],
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """Add a trial evaluated elsewhere to the study (not with a define-by-run space)."""
        if self._func is not None:
            raise TypeError(
                "OptunaSearch: evaluated points need a dict space; a define-by-run function "
                "can't say which distribution each parameter came from"
            )
        study = self._ensure_study()
        assert self._dists is not None
        params = self._flat_point(parameters)
        state = TrialState.FAIL if error else TrialState.PRUNED if pruned else TrialState.COMPLETE
        multi = isinstance(value, (list, tuple))
        trial = optuna.trial.create_trial(
            state=state,
            value=None if multi or state == TrialState.FAIL else value,
            values=list(value) if multi and state != TrialState.FAIL else None,
            params=params,
            distributions={n: self._dists[n] for n in params},
            intermediate_values=dict(enumerate(intermediate_values or [])) or None,
        )
        study.add_trial(trial)

    # -- state ------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # One blob for the whole __dict__: the sampler may hold locks, and pickling it together
        # with the study and the in-flight Trials keeps them sharing one (copied) study.
        return {"blob": _dumps(self.__dict__)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(pickle.loads(state["blob"]))

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (created on first use)."""
        return self._ensure_study()

    def get_state(self) -> dict:
        in_memory = self._storage is None or isinstance(
            self._storage, optuna.storages.InMemoryStorage
        )
        return {
            "metric": self._metric,
            "mode": self._mode,
            "study_name": self._study_name,
            "storage_url": self._storage if isinstance(self._storage, str) else None,
            "study": _dumps(self._study) if in_memory and self._study is not None else None,
            "sampler": None if in_memory or self._study is None else _dumps(self._study.sampler),
            "trials": {tid: t._trial_id for tid, t in self._ot_trials.items()},
            "completed": sorted(self._completed),
            "points": self._points,
            "rewards": self._rewards,
            "space": None
            if self._dists is None
            else {"dists": self._dists, "paths": self._paths, "template": self._template},
        }

    def set_state(self, state: dict) -> None:
        self._metric, self._mode = state["metric"], state["mode"]
        self._study_name = state["study_name"]
        self._points, self._rewards = list(state["points"]), state["rewards"]
        if state["space"] is not None and self._func is None:
            self._dists = state["space"]["dists"]
            self._paths = state["space"]["paths"]
            self._template = state["space"]["template"]
        if self._storage is None and state["storage_url"] is not None:
            self._storage = state["storage_url"]
        if state["study"] is not None:
            self._study = pickle.loads(state["study"])
        elif state["study_name"] is not None and self._storage is not None:
            sampler = pickle.loads(state["sampler"]) if state["sampler"] else self._make_sampler()
            self._study = optuna.load_study(
                study_name=state["study_name"],
                storage=self._resolved_storage(),
                sampler=sampler,
                pruner=optuna.pruners.NopPruner(),
            )
        else:
            self._study = None
        self._ot_trials = {}
        if self._study is not None:
            for tid, storage_id in state["trials"].items():
                self._ot_trials[tid] = optuna.Trial(self._study, storage_id)
        self._completed = set(state["completed"])


def _grid_exhausted(study: optuna.Study) -> bool:
    """Whether a GridSampler has handed out every grid point (to running trials too)."""
    sampler = study.sampler
    if not isinstance(sampler, optuna.samplers.GridSampler):
        return False
    if sampler.is_exhausted(study):
        return True
    grids = getattr(sampler, "_all_grids", None)  # is_exhausted ignores running trials
    if grids is None:
        return False
    taken = {t.system_attrs.get("grid_id") for t in study.get_trials(deepcopy=False)}
    return len(taken - {None}) >= len(grids)


def _unnest_slashes(config: dict[str, Any]) -> dict[str, Any]:
    """Nest ``{"a/b": 1}`` into ``{"a": {"b": 1}}`` (Optuna names are flat)."""
    if not any(isinstance(k, str) and sp.SEP in k for k in config):
        return config
    plain = {k: v for k, v in config.items() if not (isinstance(k, str) and sp.SEP in k)}
    nested = sp.unflatten({k: v for k, v in config.items() if k not in plain})
    out = dict(plain)
    for key, value in nested.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
