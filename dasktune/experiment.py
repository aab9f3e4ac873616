"""The experiment's saved state: written atomically while it runs, read back by restore.

Three files at the experiment root:

- ``experiment_state.json``: the trials (plain JSON, :meth:`Trial.to_state`) and a
  summary; replaced atomically, so a driver killed while writing leaves the previous
  one intact. Tools (``dasktune ls``, the dashboard) read only this.
- ``searcher-state.pkl``: the search algorithm's and scheduler's ``get_state()``.
- ``tuner.pkl``: the param space and configs, written once (no trainable: restore is
  given it again, as in Ray).

What storage holds beyond the saved state (rows, checkpoints and trial-end markers
written after the last save) is read by :mod:`dasktune.driver.restore`, the one place
restore interprets trial folders; this module reads the three files and wires.
"""

from __future__ import annotations

import json
import logging
import operator
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle

from dasktune.driver.restore import Restoration, restore_trials
from dasktune.results import ResultGrid
from dasktune.stopper import Stopper
from dasktune.storage import (
    SEARCHER_STATE_FILE,
    STATE_FILE,
    TUNER_FILE,
    ExperimentStorage,
    json_default,
)
from dasktune.transfer import scrub_options
from dasktune.trial import FINISHED, Trial

if TYPE_CHECKING:
    from dasktune.config import RunConfig, TuneConfig
    from dasktune.driver import TuneController
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm

STATE_VERSION = 1


class StateWriter:
    """Writes the experiment state; called by the controller (rate-limited there)."""

    def __init__(self, storage: ExperimentStorage, *, name: str, uid: str, trainable_name: str,
                 tune_config: TuneConfig, run_config: RunConfig, param_space: dict[str, Any]):
        self.storage = storage
        self.name = name
        self.uid = uid
        self.trainable_name = trainable_name
        self.tune_config = tune_config
        self.run_config = run_config
        self.param_space = param_space
        self.start_time = time.time()
        self._warned = False
        self._texts: dict[str, tuple[tuple[Any, ...], str]] = {}

    def write_static(self) -> None:
        """``tuner.pkl``: what restore needs besides the trainable."""
        rc = self.run_config
        # The filesystem object may hold credentials: restore is given it again.
        run_config = _replace(rc, storage_filesystem=None,
                              storage_options=scrub_options(rc.storage_options), callbacks=[
            cb for cb in (rc.callbacks or []) if _picklable(cb)])
        data = cloudpickle.dumps({
            "param_space": self.param_space,
            "tune_config": self.tune_config,
            "run_config": run_config,
            "uid": self.uid,
            "trainable_name": self.trainable_name,
        })
        self.storage.write_bytes(self.storage.path(TUNER_FILE), data)

    def __call__(self, controller: TuneController, wait: bool = True) -> Future[float] | None:
        """Write the experiment's state: the searcher's, then the trials'.

        The text is built here, from the driver's objects; with ``wait=False`` the two
        writes go to the storage's io thread (local stores), so the driver loop does not
        stall on a file that grows with the trial count, and the returned future gives
        the write's duration in seconds (or its :class:`StorageError`).
        """
        tc = self.tune_config
        trials = controller.trials
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        state = {
            "version": STATE_VERSION,
            "name": self.name,
            "uid": self.uid,
            "trainable_name": self.trainable_name,
            "storage": self.storage.uri,
            "metric": tc.metric,
            "mode": tc.mode,
            "searcher": type(controller.search_alg).__name__,
            "scheduler": type(controller.scheduler).__name__,
            "start_time": self.start_time,
            "timestamp": time.time(),
            "finished": controller.search_alg.is_finished() and all(t.is_finished for t in trials),
            "trial_counts": counts,
            "trials": [],
        }
        try:
            searcher_state = cloudpickle.dumps({
                "search_alg": controller.search_alg.get_state(),
                "scheduler": controller.scheduler.get_state()
                if hasattr(controller.scheduler, "get_state") else None,
                # A user's Stopper carries state (a TimeoutStopper's budget left).
                "stopper": self.run_config.stop
                if isinstance(self.run_config.stop, Stopper) else None,
            })
        except Exception as exc:  # noqa: BLE001 - keep saving the trials regardless
            if not self._warned:
                logging.getLogger(__name__).warning(
                    "the searcher/scheduler state cannot be pickled (%r): a restore will "
                    "start a fresh search for the remaining samples", exc)
                self._warned = True
            searcher_state = None
        head = _dumps(state)
        assert head.endswith('"trials":[]}')
        text = head[:-2] + self._trials_text(trials) + "]}"

        def write() -> float:
            start = time.monotonic()
            # Searcher first: a state file never points at a searcher state older than it.
            if searcher_state is not None:
                self.storage.write_bytes(self.storage.path(SEARCHER_STATE_FILE),
                                         searcher_state)
            self.storage.write_bytes(self.storage.path(STATE_FILE), text.encode())
            return time.monotonic() - start

        if wait or not self.storage.is_local:
            write()
            return None
        # The io thread also writes the result files, in order: one queue, one writer.
        return self.storage.io.submit(write)

    def _trials_text(self, trials: list[Trial]) -> str:
        """The trials' JSON array items; a finished trial's text is kept while nothing
        it holds changes (the state is rewritten all through a run: with 10k trials,
        re-encoding every one each time would take the driver tens of milliseconds per
        save). One loop with its lookups bound: it runs for every trial at every save."""
        texts, trial_key, placement_key = self._texts, _TRIAL_KEY, _PLACEMENT_KEY
        out = []
        for trial in trials:
            if trial.status not in FINISHED:
                out.append(_dumps(trial.to_state()))
                continue
            placements = trial.placements
            key = (trial_key(trial), len(trial.checkpoints), len(placements),
                   placement_key(placements[-1]) if placements else None,
                   id(trial.last_result), id(trial.config))
            cached = texts.get(trial.trial_id)
            if cached is None or cached[0] != key:
                cached = texts[trial.trial_id] = (key, _dumps(trial.to_state()))
            out.append(cached[1])
        return ",".join(out)


# What a finished trial's saved text depends on (with its lists' lengths and the ids of
# its result and config, which are replaced, never changed in place).
_TRIAL_KEY = operator.attrgetter(
    "status", "attempt", "logged_iteration", "checkpoint", "num_failures", "num_restarts",
    "error_file", "error_msg", "stop_reason", "restore_path")
_PLACEMENT_KEY = operator.attrgetter("end", "host", "outcome")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=json_default, separators=(",", ":"))


def _replace(rc: RunConfig, **changes: Any) -> RunConfig:
    import copy

    new = copy.copy(rc)
    for k, v in changes.items():
        setattr(new, k, v)
    return new


def _picklable(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:  # noqa: BLE001
        return False


@dataclass
class RestoredExperiment:
    """An experiment read back from storage, ready to continue or inspect."""

    storage: ExperimentStorage
    state: dict[str, Any]
    trials: list[Trial]
    param_space: dict[str, Any]
    tune_config: TuneConfig
    run_config: RunConfig
    search_alg: SearchAlgorithm
    scheduler: TrialScheduler
    uid: str
    saved_trials: list[Trial] | None = None
    trainable_name: str | None = None
    # What storage holds beyond the saved state, for the restored driver to carry out
    # (rows to log, superseded checkpoints, trials that ended unheard).
    restoration: Restoration | None = None

    def result_grid(self) -> ResultGrid:
        """The results as saved (before any resume/restart decision)."""
        cc = self.run_config.checkpoint_config
        return ResultGrid(self.saved_trials or self.trials, self.storage, metric=self.tune_config.metric,
                          mode=self.tune_config.mode,
                          score_attr=cc.checkpoint_score_attribute if cc else None,
                          score_order=cc.checkpoint_score_order if cc else "max")


def _open(path: str, storage_filesystem: Any, storage_options: dict[str, Any] | None = None
          ) -> ExperimentStorage:
    if "://" not in path and storage_filesystem is None:
        import os

        path = os.path.abspath(os.path.expanduser(path))
    return ExperimentStorage.from_experiment_path(path, filesystem=storage_filesystem,
                                                  storage_options=storage_options)


def can_restore(path: str, storage_filesystem: Any = None,
                storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``path`` holds the state and ``tuner.pkl`` of an experiment."""
    return _try_open(path, storage_filesystem, storage_options) is not None


def _holds_experiment(storage: ExperimentStorage) -> bool:
    # As Ray: restorable once a Tuner was constructed there (tuner.pkl), before any state.
    try:
        return storage.exists(storage.path(TUNER_FILE))
    except Exception:  # noqa: BLE001 - unreachable or malformed: not restorable
        return False


def _try_open(path: str, storage_filesystem: Any, storage_options: dict[str, Any] | None
              ) -> ExperimentStorage | None:
    """The storage at ``path`` if it reaches a restorable experiment there, else None."""
    try:
        storage = _open(path, storage_filesystem, storage_options)
    except Exception:  # noqa: BLE001 - unreachable or malformed: not restorable
        return None
    return storage if _holds_experiment(storage) else None


def read_state(storage: ExperimentStorage) -> dict[str, Any]:
    return storage.read_json(storage.path(STATE_FILE))


def load(path: str, *, storage_filesystem: Any = None,
         storage_options: dict[str, Any] | None = None, resume_unfinished: bool = True,
         resume_errored: bool = False, restart_errored: bool = False) -> RestoredExperiment:
    """Read an experiment and decide what each trial does next (Ray's restore rules).

    ``storage_filesystem`` / ``storage_options`` reach the experiment's storage (they
    are not saved with credentials); without them the saved ``storage_options``
    (scrubbed of credentials) are used for the restored run.
    """
    from dasktune.tuner_build import make_scheduler, make_search_alg

    storage = _open(path, storage_filesystem, storage_options)
    if not _holds_experiment(storage):
        raise ValueError(f"no restorable experiment at {storage.uri!r} "
                         f"(expected {TUNER_FILE} there)")
    static = cloudpickle.loads(storage.read_bytes(storage.path(TUNER_FILE)))
    # No state yet: the Tuner was constructed but never fit; it starts afresh.
    state = read_state(storage) if storage.exists(storage.path(STATE_FILE)) else {"trials": []}
    tune_config: TuneConfig = static["tune_config"]
    run_config: RunConfig = static["run_config"]
    if storage_filesystem is not None:
        run_config.storage_filesystem = storage_filesystem
    if storage_options is not None:
        run_config.storage_options = storage_options
    elif storage_filesystem is None and run_config.storage_options:
        # The saved options (endpoints, regions, client settings) shape the restored
        # run's filesystem; credentials come from the usual places again. Kept only if
        # they still reach the experiment (a saved endpoint may be gone).
        storage = _try_open(path, None, run_config.storage_options) or storage
    # Storage is where the experiment is now (it may have been moved or copied).
    run_config.name = storage.name
    uid = static["uid"]
    search_alg = make_search_alg(tune_config, static["param_space"], uid)
    scheduler = make_scheduler(tune_config)
    try:
        saved = cloudpickle.loads(storage.read_bytes(storage.path(SEARCHER_STATE_FILE)))
    except FileNotFoundError:
        saved = {}
    if saved.get("search_alg") is not None:
        search_alg.set_state(saved["search_alg"])
    if saved.get("scheduler") is not None and hasattr(scheduler, "set_state"):
        scheduler.set_state(saved["scheduler"])
    if saved.get("stopper") is not None:  # as saved last (a TimeoutStopper's budget left)
        run_config.stop = saved["stopper"]
    saved = [Trial.from_state(t) for t in state["trials"]]
    trials = [Trial.from_state(t) for t in state["trials"]]
    restoration = restore_trials(trials, storage, resume_unfinished=resume_unfinished,
                                 resume_errored=resume_errored,
                                 restart_errored=restart_errored)
    return RestoredExperiment(storage=storage, state=state, trials=trials,
                              param_space=static["param_space"], tune_config=tune_config,
                              run_config=run_config, search_alg=search_alg,
                              scheduler=scheduler, uid=uid, saved_trials=saved,
                              trainable_name=static.get("trainable_name"),
                              restoration=restoration)
