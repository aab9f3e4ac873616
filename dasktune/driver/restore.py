"""Restore's reading of storage: what each saved trial does next, and what storage holds
of it that the saved state does not.

The saved state lags a killed driver's result files and checkpoints by a few seconds,
and those files may disagree among themselves (a row flushed to one and not to another,
a torn last line, the rows of a trial the state never saw). One rule makes them agree:

- **A trial's record is its ``result.json``**: its complete rows, in order (a torn last
  line is not one; the JSON logger is the first to be handed a result, and its file is
  the one restore reads). The rows after the one the saved state saw last were logged
  after the save: the trial's logged count is the last of them (else the state's). On
  restore, every logger file of a trial that goes on is rewritten to exactly
  these rows (``Callback.on_trial_restore_results``), so ``progress.csv``, TensorBoard
  and ``Result.metrics_dataframe`` hold what ``result.json`` holds. The attempt that
  goes on then logs only iterations past that count (the driver's live rule), and a
  trial that starts over (``restart_errored``, or a trial the state never saw) starts
  from empty files: no iteration is logged twice. (Rows are not deduplicated by
  iteration: after a PBT exploit the count legitimately goes on from the donor's.)
- **Rows storage holds that no driver logged** -- the result a committed checkpoint
  was reported with, the final result of the trial-end marker -- when they come next,
  are logged through the callbacks (``on_trial_result``), like live results.
- **The resume point** is the newest committed checkpoint of the trial's lineage at
  most one iteration past the record. Every other checkpoint folder the state does not
  list (an older attempt's, an uncommitted one, an orphan ahead of the record) is
  superseded: the checkpoint book deletes it, then ``num_to_keep`` holds again.
- **A trial folder no saved trial owns** (a trial the killed driver made after its last
  save; the restored searcher suggests it again) is deleted: that trial starts afresh.
  Unless it finished (its trial-end marker): then it is kept until the restored driver
  makes its trial, and adopted (:meth:`Restoration.adopt`) if that trial's config is the
  folder's ``params.json`` -- TERMINATED with its record, never run again -- else
  deleted then.

:func:`restore_trials` reads and decides (it changes only the :class:`Trial` objects);
:meth:`Restoration.carry_out` is the restored driver's first act, through the
callbacks and the checkpoint book. (Over 400 lines: the reading of a trial's folder and
the carrying out share one set of rules and helpers; split, they would need each other's
private names.)
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune.layout import checkpoint_index
from dasktune.logger import EXPR_PARAM_FILE, EXPR_RESULT_FILE
from dasktune.result import EARLY_STOPPED
from dasktune.results import read_result_json
from dasktune.storage import json_default
from dasktune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED, Trial

if TYPE_CHECKING:
    from dasktune.callback import Callback
    from dasktune.driver.checkpoint_book import CheckpointBook
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm
    from dasktune.storage import ExperimentStorage

__all__ = ["LineageScan", "Recovery", "Restoration", "checkpoint_info", "restore_trials",
           "scan_lineage", "unlogged_row"]

logger = logging.getLogger(__name__)


def _iteration(row: dict[str, Any]) -> int:
    try:
        return int(row.get("training_iteration", 0))
    except (TypeError, ValueError):
        return 0


@dataclass
class Recovery:
    """What restore found in storage for one trial that goes on (or ended unheard)."""

    trial: Trial
    #: The trial's logged results: its logger files are rewritten to them (None: the
    #: trial has no folder yet, nothing to rewrite).
    results: list[dict[str, Any]] | None = None
    #: Results storage holds that no driver logged: logged through the callbacks.
    unlogged: list[dict[str, Any]] = field(default_factory=list)
    #: Checkpoint folders no resume will use: deleted by the checkpoint book.
    superseded: list[str] = field(default_factory=list)
    #: The trainable returned (trial-end marker) and no saved state says so: TERMINATED,
    #: and the restored searcher and scheduler, which count it as running, are told.
    ended: bool = False


@dataclass
class Restoration:
    """Everything restore found, for the restored driver to carry out first."""

    storage: ExperimentStorage
    recoveries: list[Recovery] = field(default_factory=list)
    #: Trial folders no saved trial owns (and whose trial did not finish).
    stale_folders: list[str] = field(default_factory=list)
    #: Folders no saved trial owns whose trial finished: folder -> its trial-end marker.
    #: Each waits for the restored driver to make its trial again (:meth:`adopt`).
    unsaved_ends: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Carried out already (a second ``fit()`` of the restored Tuner must not rewrite
    #: the files to what was read before the first).
    carried_out: bool = False

    @property
    def ended_unheard(self) -> list[str]:
        """Ids of the trials whose end only storage knew."""
        return [r.trial.trial_id for r in self.recoveries if r.ended]

    def carry_out(self, *, trials: list[Trial], callbacks: Callback, book: CheckpointBook,
                  scheduler: TrialScheduler, search_alg: SearchAlgorithm, context: Any,
                  save: Callable[[], None]) -> None:
        """Make storage agree with the restored trials (after ``callbacks.setup``):
        rewrite their logger files to the record, log the rows no driver logged, tell
        the deciders and callbacks of unheard ends, save the state (so it points at the
        resume points), then delete superseded checkpoints and apply retention. Once."""
        if self.carried_out:
            return
        self.carried_out = True
        for folder in self.stale_folders:
            self.storage.delete(folder)
        for rec in self.recoveries:
            _log_record(rec, trials, callbacks, 0)
        for rec in self.recoveries:
            if rec.ended:
                _tell_end(rec, trials, callbacks, scheduler, search_alg, context, 0)
        if self.recoveries:
            # Before retention deletes anything (the saved state never points at a
            # checkpoint retention removed), after the deciders heard of the ends (a
            # state saving a trial TERMINATED has a searcher state that knows it).
            save()
        for rec in self.recoveries:
            book.drop_superseded(rec.trial, rec.superseded)

    def adopt(self, trial: Trial) -> Recovery | None:
        """For ``trial``, just made by the restored driver (PENDING, never started): if
        the killed driver had made and finished it after its last save (its folder holds
        a trial-end marker and a ``params.json`` equal to ``trial.config``), bring it up
        to its record and return the :class:`Recovery` (``ended``; the caller sets it
        TERMINATED, then :meth:`carry_out_adopted`). Otherwise None, and a folder that
        killed driver left at ``trial.path`` is deleted: the trial starts afresh."""
        end = self.unsaved_ends.pop(trial.path, None) if trial.path else None
        if end is None:
            return None
        assert trial.path is not None
        if _params(self.storage, trial.path) != _as_json(trial.config):
            self.storage.delete(trial.path)  # another trial's (e.g. an unseeded searcher)
            return None
        trial.attempt = int(end.get("attempt", 0))
        rec = _catch_up(trial, self.storage)
        _ended_in_storage(trial, self.storage, rec)
        rec.ended = True
        return rec

    def carry_out_adopted(self, rec: Recovery, *, trials: list[Trial], callbacks: Callback,
                          book: CheckpointBook, scheduler: TrialScheduler,
                          search_alg: SearchAlgorithm, context: Any, iteration: int) -> None:
        """What :meth:`carry_out` does for a trial :meth:`adopt` adopted (TERMINATED now):
        its logger files rewritten to its record, the rows no driver logged logged, the
        deciders and callbacks told of its end, superseded checkpoints deleted."""
        _log_record(rec, trials, callbacks, iteration)
        _tell_end(rec, trials, callbacks, scheduler, search_alg, context, iteration)
        book.drop_superseded(rec.trial, rec.superseded)

    def drop_unadopted(self) -> None:
        """Delete the finished folders no trial of the restored run adopted (its searcher
        is finished: it will not make their trials)."""
        for folder in list(self.unsaved_ends):
            del self.unsaved_ends[folder]
            try:
                self.storage.delete(folder)
            except Exception:  # noqa: BLE001 - a storage outage must not fail the end
                logger.warning("could not delete %s, a trial folder no trial owns", folder)


def _log_record(rec: Recovery, trials: list[Trial], callbacks: Callback, iteration: int
                ) -> None:
    """Rewrite the trial's logger files to its record; log the rows no driver logged."""
    if rec.results is not None:
        callbacks.on_trial_restore_results(iteration=iteration, trials=trials,
                                           trial=rec.trial, results=rec.results)
    for row in rec.unlogged:
        callbacks.on_trial_result(iteration=iteration, trials=trials, trial=rec.trial,
                                  result=row)


def _tell_end(rec: Recovery, trials: list[Trial], callbacks: Callback,
              scheduler: TrialScheduler, search_alg: SearchAlgorithm, context: Any,
              iteration: int) -> None:
    """Tell the deciders and callbacks that a trial only storage knew had ended ended."""
    trial = rec.trial
    final = dict(trial.last_result)
    scheduler.on_trial_complete(context, trial, final)
    if trial.stop_reason == "early_stopped":
        final[EARLY_STOPPED] = True
    search_alg.on_trial_complete(trial.trial_id, result=final)
    callbacks.on_trial_complete(iteration=iteration, trials=trials, trial=trial)


def _as_json(config: dict[str, Any]) -> Any:
    """A config as its ``params.json`` holds it."""
    return json.loads(json.dumps(config, default=json_default))


def _params(storage: ExperimentStorage, folder: str) -> Any:
    """The config a trial folder's ``params.json`` holds (None: absent or broken)."""
    try:
        return storage.read_json(posixpath.join(folder, EXPR_PARAM_FILE))
    except (FileNotFoundError, ValueError):
        return None


def restore_trials(trials: list[Trial], storage: ExperimentStorage, *,
                   resume_unfinished: bool = True, resume_errored: bool = False,
                   restart_errored: bool = False) -> Restoration:
    """Decide what each of ``trials`` (as saved) does next, by Ray's restore rules, and
    bring it up to what storage holds; the returned :class:`Restoration` says what the
    restored driver must do to storage and the callbacks."""
    out = Restoration(storage)
    for trial in trials:
        rec = _decide(trial, storage, resume_unfinished, resume_errored, restart_errored)
        if rec is not None:
            out.recoveries.append(rec)
    for folder in _stale_folders(trials, storage):
        end = storage.read_trial_end(folder)
        if end is not None:
            out.unsaved_ends[folder] = end
        else:
            out.stale_folders.append(folder)
    return out


def _stale_folders(trials: list[Trial], storage: ExperimentStorage) -> list[str]:
    """Trial folders (they hold a trial's ``params.json`` or ``result.json``) that no
    saved trial owns."""
    owned = {posixpath.basename(t.path.rstrip("/")) for t in trials if t.path}
    stale = []
    for name in storage.list_names(storage.experiment_path, folders_only=True):
        if name in owned:
            continue
        folder = storage.path(name)
        names = set(storage.list_names(folder))
        if EXPR_PARAM_FILE in names or EXPR_RESULT_FILE in names:
            stale.append(folder)
    return stale


def _decide(trial: Trial, storage: ExperimentStorage, resume_unfinished: bool,
            resume_errored: bool, restart_errored: bool) -> Recovery | None:
    """Set what ``trial`` does next; its :class:`Recovery` when it goes on (or ended
    unheard), else None (it stays as saved)."""
    trial.attempt = max(trial.attempt, len(trial.placements))
    if trial.status == TERMINATED:
        return None
    if trial.status == ERROR:
        # Both flags set: resume wins, as in Ray's Tuner.restore.
        if not (resume_errored or restart_errored):
            return None
        rec = _catch_up(trial, storage) if resume_errored else _start_over(trial, storage)
        trial.status = PENDING
        trial.num_failures = 0
        trial.error_msg = None
        return rec
    if trial.status not in (PENDING, RUNNING, PAUSED):
        return None
    if not resume_unfinished:
        trial.status = TERMINATED
        return None
    rec = _catch_up(trial, storage)
    if _ended_in_storage(trial, storage, rec):
        trial.status = TERMINATED  # its trainable returned: never run it again
        rec.ended = True
    else:
        trial.status = PAUSED if trial.status == PAUSED else PENDING
    return rec


def _catch_up(trial: Trial, storage: ExperimentStorage) -> Recovery:
    """Bring ``trial`` up to its record and its newest usable checkpoint."""
    rec = Recovery(trial)
    if not trial.path or not storage.list_names(trial.path):
        return rec  # never started: storage holds nothing of it
    rows = read_result_json(storage.fs, trial.path)  # complete rows, in order
    rec.results = rows
    seen = _last_seen(rows, trial.last_result) if trial.logged_iteration else -1
    if seen is not None:
        for row in rows[seen + 1:]:  # logged after the state was saved
            trial.update_last_result(row)
            trial.logged_iteration = _iteration(row)
    else:
        # The row the state saw last never reached the file (it was still being opened
        # at the kill): the attempt that goes on runs and logs what is missing again.
        trial.last_result = dict(rows[-1]) if rows else {}
        trial.logged_iteration = _iteration(rows[-1]) if rows else 0
    _resume_point(trial, storage, rec)
    return rec


@dataclass
class LineageScan:
    """What a trial's folder holds beyond the checkpoints its record lists."""

    #: Committed checkpoints of the lineage at or before the logged count, oldest first:
    #: (path, manifest).
    adopt: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: The committed checkpoint one iteration past the logged count, with the result it
    #: was reported with (never logged: the driver died or the report was lost).
    next_row: tuple[str, dict[str, Any]] | None = None
    #: Every other unlisted checkpoint folder: uncommitted, a zombie's, or ahead.
    superseded: list[str] = field(default_factory=list)


def scan_lineage(trial: Trial, storage: ExperimentStorage, *, min_attempt: int) -> LineageScan:
    """The checkpoint folders of ``trial`` that ``trial.checkpoints`` does not list, sorted
    into its lineage and the superseded (the one reading of a trial's checkpoints, for a
    restore and for an attempt lost mid-run). A checkpoint of an attempt older than
    ``min_attempt`` (or than one already adopted) is a zombie's: the trial had moved on;
    a newer attempt's is the lineage whatever its iteration (after a PBT exploit the
    count goes on from the donor's). Nothing past one iteration beyond
    ``trial.logged_iteration`` is a resume point: its result was never logged."""
    out = LineageScan()
    if not trial.path:
        return out
    known = {c["path"] for c in trial.checkpoints}
    logged = bound = trial.logged_iteration
    floor = min_attempt
    for path in storage.list_checkpoints(trial.path):  # oldest first
        if path in known:
            continue
        manifest = storage.read_manifest(path) or {}
        it = _iteration(manifest)
        attempt = int(manifest.get("attempt", 0))
        ahead = it == bound + 1 and out.next_row is None and \
            isinstance(manifest.get("result"), dict)
        if not manifest or attempt < floor or not (it <= logged or ahead) or \
                not storage.is_committed(path):
            out.superseded.append(path)
            continue
        if it > logged:
            out.next_row = (path, manifest)
            logged = it
        else:
            out.adopt.append((path, manifest))
        floor = max(floor, attempt)
    return out


def checkpoint_info(path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """A trial's record of the checkpoint at ``path`` (``trial.checkpoints``' items)."""
    result = manifest.get("result")
    metrics = {k: v for k, v in (result if isinstance(result, dict) else {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"path": path, "iteration": _iteration(manifest),
            "time_total_s": manifest.get("time_total_s", 0.0), "metrics": metrics}


def unlogged_row(trial: Trial, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The result a checkpoint was committed with, as the driver would have logged it."""
    return dict(manifest["result"], checkpoint_dir_name=posixpath.basename(path),
                config=trial.config)


def _last_seen(rows: list[dict[str, Any]], last: dict[str, Any]) -> int | None:
    """The index in ``rows`` of the row the saved state saw last (``last``), or None.
    Matched by position in the file, not by iteration alone: after a PBT exploit the
    count goes back, so an iteration may appear twice."""
    key = ("training_iteration", "time_total_s", "timestamp")
    want = tuple(last.get(k) for k in key)
    for i in range(len(rows) - 1, -1, -1):
        if tuple(rows[i].get(k) for k in key) == want:
            return i
    return None


def _resume_point(trial: Trial, storage: ExperimentStorage, rec: Recovery) -> None:
    """Adopt the committed checkpoints of the trial's lineage that the state does not
    list, up to one iteration past the record (that one's result is then unlogged);
    every other unlisted checkpoint folder is superseded."""
    # The state's newest checkpoints while they are gone or torn (retention deleted
    # them after the state was saved, or a commit was cut short).
    while trial.checkpoints and not storage.is_committed(trial.checkpoints[-1]["path"]):
        rec.superseded.append(trial.checkpoints.pop()["path"])
    newest = trial.checkpoints[-1] if trial.checkpoints else None
    trial.checkpoint = newest["path"] if newest else None
    trial.checkpoint_iteration = int(newest.get("iteration", 0)) if newest else 0
    saved_floor = int((storage.read_manifest(trial.checkpoint) or {}).get("attempt", 0)) \
        if trial.checkpoint else 0
    scan = scan_lineage(trial, storage, min_attempt=saved_floor)
    rec.superseded += [p for p in scan.superseded if p not in rec.superseded]
    found = list(scan.adopt)
    if scan.next_row is not None:
        path, manifest = scan.next_row
        row = unlogged_row(trial, path, manifest)  # the driver died before logging it
        rec.unlogged.append(row)
        trial.update_last_result(row)
        trial.logged_iteration = _iteration(manifest)
        found.append(scan.next_row)
    for path, manifest in sorted(found, key=lambda f: checkpoint_index(f[0]) or 0):
        trial.checkpoints.append(checkpoint_info(path, manifest))
        trial.checkpoint = path
        trial.checkpoint_iteration = _iteration(manifest)
        if int(manifest.get("attempt", 0)) > saved_floor:
            trial.restore_path = None  # a newer attempt committed its own: it goes on


def _start_over(trial: Trial, storage: ExperimentStorage) -> Recovery:
    """``restart_errored``: the trial starts from scratch; its files start empty and
    every checkpoint of its earlier attempts is superseded."""
    rec = Recovery(trial)
    if trial.path and storage.list_names(trial.path):
        rec.results = []
        rec.superseded = storage.list_checkpoints(trial.path)
    trial.checkpoints = []
    trial.checkpoint = None
    trial.checkpoint_iteration = 0
    trial.logged_iteration = 0
    trial.last_result = {}
    trial.metric_analysis = {}
    trial.metric_n_steps = {}
    return rec


def _ended_in_storage(trial: Trial, storage: ExperimentStorage, rec: Recovery) -> bool:
    """Whether the worker recorded that the trial's trainable returned (its end marker,
    written before the driver heard of it); its final result, if no driver logged it,
    is then unlogged."""
    end = storage.read_trial_end(trial.path) if trial.path else None
    if end is None or int(end.get("attempt", 0)) < trial.attempt:
        return False  # none, or an older attempt's (the trial went on after it)
    result = end["result"]
    if result and _iteration(result) > trial.logged_iteration:
        row = dict(result, config=trial.config)
        rec.unlogged.append(row)
        trial.update_last_result(row)
        trial.logged_iteration = _iteration(result)
    if trial.last_result:
        trial.last_result = dict(trial.last_result, done=True)
    if end.get("ended_by") == "scheduler":  # where it stopped, for the dashboard
        trial.stop_reason = "early_stopped"
        trial.stop_rung = end.get("rung")
    return True
