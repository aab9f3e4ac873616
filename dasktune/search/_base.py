"""The two search contracts: :class:`Searcher` (Ray's) and :class:`SearchAlgorithm`.

A :class:`Searcher` suggests one config per trial id and learns from results; it knows nothing
about trial ids' format, counts or grids. A :class:`SearchAlgorithm` is what the driver loop
drives: it makes trial ids and experiment tags, knows when the search is finished, and wraps a
Searcher through :class:`~dasktune.search.SearchGenerator`.

Both are pure deciders: no Dask, no storage. The driver calls them from one thread; they are
not thread safe. Their ``get_state()`` returns a picklable dict (the driver pickles it), and
``set_state()`` on a freshly built object continues the search where it stopped.
"""

from __future__ import annotations

import glob
import os
import pickle
import re
import uuid
from dataclasses import dataclass
from typing import Any

import cloudpickle

from dasktune.metric_mode import check_metric_mode, merge_search_properties

__all__ = ["SearchAlgorithm", "Searcher", "Suggestion"]

_STATE_FILE = "searcher-state-{}.pkl"  # Ray's file name, so a Ray user finds it
_UID = re.compile(r"^[0-9a-f]{8}$")


class Searcher:
    """Suggests configs and learns from results (Ray's ``ray.tune.search.Searcher``).

    Subclasses override :meth:`suggest` and usually :meth:`on_trial_complete`,
    :meth:`get_state` and :meth:`set_state`. Every hook is called by one thread.
    ``metric`` and ``mode`` may be lists for multi-objective searchers.
    """

    FINISHED = "FINISHED"

    def __init__(self, metric: str | list[str] | None = None, mode: str | list[str] | None = None):
        check_metric_mode(metric, mode, type(self).__name__)
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | list[str] | None:
        """The metric to optimize, or None until set."""
        return self._metric

    @property
    def mode(self) -> str | list[str] | None:
        """``"min"`` or ``"max"`` (or a list of them), or None until set."""
        return self._mode

    def set_search_properties(
        self, metric: str | list[str] | None, mode: str | list[str] | None, config: dict, **spec
    ) -> bool:
        """Take metric, mode and the param space from ``TuneConfig``/``Tuner``.

        Fills in metric/mode where this searcher has none; returns False when it already has
        a different one (or, in subclasses, already has its own search space).
        ``spec`` carries extra keywords such as ``num_samples``; unknown ones are ignored.
        """
        check_metric_mode(metric, mode, type(self).__name__)
        merged = merge_search_properties((self._metric, self._mode), (metric, mode),
                                         refuse_twice=False)
        if merged is None:
            return False
        self._metric, self._mode = merged
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Return True if this searcher limits concurrency itself (ConcurrencyLimiter then
        only forwards)."""
        return False

    def suggest(self, trial_id: str) -> dict | None | str:
        """A config for ``trial_id``, None for "not now", or :attr:`FINISHED` for "no more"."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An intermediate result of a running trial."""

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        """The trial ended: ``result`` is its last result, ``error`` whether it failed."""

    def add_evaluated_point(
        self,
        parameters: dict,
        value: float | list[float],
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """Tell the searcher about a point evaluated outside this experiment."""
        raise NotImplementedError(f"{type(self).__name__} does not take evaluated points")

    def add_evaluated_trials(self, trials_or_analysis: Any, metric: str) -> None:
        """Pass trials evaluated elsewhere to :meth:`add_evaluated_point` (Ray's method).

        Takes a trial, a list of trials, a ``ResultGrid`` (or its ``Result`` objects) or
        anything with a ``trials`` list; ``metric`` is read from each trial's last result.
        Failed trials are passed with ``error=True``; those without the metric are skipped.
        """
        if hasattr(trials_or_analysis, "config"):  # one Trial or Result
            trials = [trials_or_analysis]
        elif hasattr(trials_or_analysis, "trials"):  # an ExperimentAnalysis-like object
            trials = list(trials_or_analysis.trials)
        else:
            trials = list(trials_or_analysis)  # a list, or a ResultGrid (yields Results)
        points = []
        for trial in trials:
            # A Trial has last_result/status; a Result has metrics/error.
            if hasattr(trial, "last_result"):
                last, error = trial.last_result or {}, trial.status == "ERROR"
            else:
                last, error = trial.metrics or {}, trial.error is not None
            value = last.get(metric)
            if value is not None or error:
                points.append((dict(trial.config or {}), value, error))
        if trials and not any(value is not None for _, value, _ in points):
            raise ValueError(f"add_evaluated_trials: no trial reported the metric {metric!r}")
        for config, value, error in points:
            self.add_evaluated_point(config, value, error=error)

    def get_state(self) -> dict:
        """A picklable dict from which :meth:`set_state` continues the search."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_state")

    def set_state(self, state: dict) -> None:
        """Continue from a :meth:`get_state` dict."""
        raise NotImplementedError(f"{type(self).__name__} does not implement set_state")

    def save(self, checkpoint_path: str) -> None:
        """Pickle (cloudpickle) :meth:`get_state` to ``checkpoint_path`` (written atomically)."""
        tmp = f"{checkpoint_path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            cloudpickle.dump(self.get_state(), f)  # lambdas in a searcher's state survive
        os.replace(tmp, checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Load a file written by :meth:`save`."""
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        """Save to ``checkpoint_dir/searcher-state-<session_str>.pkl`` (Ray's file name)."""
        os.makedirs(checkpoint_dir, exist_ok=True)
        self.save(os.path.join(checkpoint_dir, _STATE_FILE.format(session_str)))

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        """Restore from the newest ``searcher-state-*.pkl`` in ``checkpoint_dir``."""
        paths = glob.glob(os.path.join(glob.escape(checkpoint_dir), _STATE_FILE.format("*")))
        if not paths:
            raise RuntimeError(
                f"{type(self).__name__} found no searcher-state-*.pkl in {checkpoint_dir!r}"
            )
        self.restore(max(paths, key=lambda p: (os.path.getmtime(p), p)))


@dataclass
class Suggestion:
    """A new trial to start: its id, its resolved config, and Ray's experiment tag."""

    trial_id: str
    config: dict
    experiment_tag: str


class SearchAlgorithm:
    """What the driver loop drives: makes trials until :meth:`is_finished`.

    Trial ids are ``f"{experiment_uid}_{counter:05d}"``; ``experiment_uid`` (8 hex digits)
    comes from the constructor or the ``experiment_uid`` keyword of
    :meth:`set_search_properties`, else it is random. The counter starts at 0 and also
    opens the experiment tag (``"3_lr=0.01,layers=2"``).
    """

    def __init__(self, *, experiment_uid: str | None = None) -> None:
        self._experiment_uid = _check_uid(experiment_uid) if experiment_uid else _new_uid()
        self._counter = 0
        self._finished = False

    @property
    def experiment_uid(self) -> str:
        """The 8-hex prefix of this experiment's trial ids."""
        return self._experiment_uid

    def set_search_properties(
        self, metric: str | list[str] | None, mode: str | list[str] | None, config: dict, **spec
    ) -> bool:
        """Take metric, mode, the param space and ``num_samples``/``experiment_uid``."""
        if spec.get("experiment_uid"):
            self._experiment_uid = _check_uid(spec["experiment_uid"])
        return True

    def next_trial(self) -> Suggestion | None:
        """The next trial, or None if there is none right now (see :meth:`is_finished`)."""
        raise NotImplementedError

    def is_finished(self) -> bool:
        """True once no more trials will come."""
        return self._finished

    @property
    def total_samples(self) -> int | None:
        """How many trials this search makes in all, or None if unknown or unbounded."""
        return None

    @property
    def suggests_ahead(self) -> bool:
        """Whether asking for a trial early costs nothing: the suggestions do not depend
        on results, so the driver may queue the next trial behind a running one."""
        return False

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An intermediate result of a running trial."""

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        """A trial ended."""

    def get_state(self) -> dict:
        """A picklable dict from which :meth:`set_state` continues (no repeated trial ids)."""
        return {
            "experiment_uid": self._experiment_uid,
            "counter": self._counter,
            "finished": self._finished,
        }

    def set_state(self, state: dict) -> None:
        """Continue from a :meth:`get_state` dict."""
        self._experiment_uid = state["experiment_uid"]
        self._counter = state["counter"]
        self._finished = state["finished"]

    def _trial_id(self) -> str:
        return f"{self._experiment_uid}_{self._counter:05d}"


def _new_uid() -> str:
    return uuid.uuid4().hex[:8]


def _check_uid(uid: Any) -> str:
    if not isinstance(uid, str) or not _UID.match(uid):
        raise ValueError(f"experiment_uid must be 8 lowercase hex digits, got {uid!r}")
    return uid


def check_num_samples(num_samples: Any, where: str) -> int | None:
    """Validate ``num_samples``: an int >= 1, or -1 for unbounded (returned as None)."""
    if not isinstance(num_samples, int) or isinstance(num_samples, bool):
        raise TypeError(f"{where}: num_samples must be an int, got {num_samples!r}")
    if num_samples == -1:
        return None
    if num_samples < 1:
        raise ValueError(f"{where}: num_samples must be >= 1 (or -1 for unbounded), got {num_samples}")
    return num_samples
