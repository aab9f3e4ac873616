"""The checkpoint book: which checkpoints each trial has, which to keep, where to restore.

The driver registers every checkpoint a report brings (:meth:`CheckpointBook.register`);
the book keeps ``CheckpointConfig.num_to_keep`` of them per trial (never the newest, nor
one another trial is about to restore: a PBT donor's), knows the checkpoint an exploited
trial restores from until it commits one of its own (the lineage), and finds a checkpoint
a lost attempt committed but never reported (:meth:`CheckpointBook.unreported`), and
deletes the checkpoints a restore found superseded (:meth:`CheckpointBook.drop_superseded`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dasktune.checkpoint import Checkpoint
from dasktune.driver.restore import scan_lineage, unlogged_row
from dasktune.execution import Report
from dasktune.layout import checkpoint_index

if TYPE_CHECKING:
    from dasktune.callback import Callback
    from dasktune.config import CheckpointConfig
    from dasktune.schedulers import Exploit
    from dasktune.storage import ExperimentStorage
    from dasktune.trial import Trial

__all__ = ["CheckpointBook"]


class CheckpointBook:
    """Checkpoints of the trials in ``trials`` (the driver's list, shared).

    Args:
        storage: the experiment's storage (retention deletes there).
        config: the run's :class:`~dasktune.CheckpointConfig`.
        trials: the driver's trials (read: a checkpoint may belong to any of them).
        callbacks: told ``on_trial_save`` and ``on_checkpoint`` per registered checkpoint.
        iteration: the driver's step count, for the callbacks.
    """

    def __init__(self, storage: ExperimentStorage, config: CheckpointConfig,
                 trials: list[Trial], callbacks: Callback, iteration: Callable[[], int]):
        self.storage = storage
        self.config = config
        self._trials = trials
        self._callbacks = callbacks
        self._iteration = iteration
        # Exploits decided, not yet carried out: their donors' checkpoints must stay.
        self._exploits: dict[str, Exploit] = {}
        # An exploited trial's next start restores its donor's checkpoint: its metadata.
        self._restore_meta: dict[str, dict[str, Any]] = {}
        # Past the checkpoint folders of a trial that a restore deleted (next_index).
        self._index_floor: dict[str, int] = {}

    # ------------------------------------------------------------- registering
    def register(self, trial: Trial, path: str, result: dict[str, Any] | None) -> None:
        """``trial`` committed the checkpoint ``path`` (with ``result``, if any)."""
        metrics = {k: v for k, v in (result or trial.last_result or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        iteration = int((result or {}).get("training_iteration", trial.logged_iteration))
        info = {"path": path, "iteration": iteration,
                "time_total_s": float(metrics.get("time_total_s", 0.0)), "metrics": metrics}
        trial.checkpoints.append(info)
        trial.checkpoint = path
        trial.checkpoint_iteration = iteration
        self.enforce_retention(trial)
        self.unpin_restore(trial)  # the trial's own lineage now goes on from here
        step = self._iteration()
        self._callbacks.on_trial_save(iteration=step, trials=self._trials, trial=trial)
        self._callbacks.on_checkpoint(iteration=step, trials=self._trials, trial=trial,
                                      checkpoint=Checkpoint(path, self.storage.fs))

    def unreported(self, trial: Trial) -> Report | None:
        """What the lost attempt of ``trial`` committed before the driver heard of it
        (:func:`~dasktune.driver.restore.scan_lineage`, as a restore reads it):
        checkpoints at or before the logged iteration are registered; one at the very
        next iteration is returned as a report for the driver's report path (so the
        result files keep no hole); every other unlisted folder of the trial (torn,
        a zombie's, ahead of the log) is deleted, so ``num_to_keep`` holds across
        retries."""
        scan = scan_lineage(trial, self.storage, min_attempt=trial.attempt)
        for path, manifest in scan.adopt:
            result = manifest.get("result")
            self.register(trial, path, dict(result) if isinstance(result, dict) else {
                "training_iteration": manifest.get("training_iteration", 0),
                "time_total_s": manifest.get("time_total_s", 0.0)})
        if scan.superseded:
            self.drop_superseded(trial, scan.superseded)
        if scan.next_row is None:
            return None
        path, manifest = scan.next_row
        return Report(0, unlogged_row(trial, path, manifest), path)

    # ------------------------------------------------------------- exploits (PBT)
    def hold_for_exploit(self, trial: Trial, exploit: Exploit) -> None:
        """``trial`` will restart from ``exploit.checkpoint``: keep that one meanwhile."""
        self._exploits[trial.trial_id] = exploit

    def drop_exploit(self, trial: Trial) -> None:
        """The exploit of ``trial`` will not happen (its attempt was lost)."""
        self._exploits.pop(trial.trial_id, None)

    def carry_out_exploit(self, trial: Trial, trials: Mapping[str, Trial]) -> None:
        """``trial``'s attempt ended for its exploit: it restarts from the donor's
        checkpoint (the donor one of ``trials``) with the new config, counting iterations
        on from there (as in Ray: they are new results, not re-runs of logged ones)."""
        exploit = self._exploits.pop(trial.trial_id)
        trial.config = dict(exploit.config)
        trial.restore_path = exploit.checkpoint
        donor = trials.get(exploit.donor_trial_id)
        meta = self.restore_meta(donor or trial, exploit.checkpoint)
        self._restore_meta[trial.trial_id] = meta
        trial.logged_iteration = int(meta["training_iteration"])

    # ------------------------------------------------------------- restoring
    def restore_for(self, trial: Trial) -> tuple[str | None, dict[str, Any]]:
        """Where ``trial``'s next attempt restores from, and that checkpoint's
        ``training_iteration`` and ``time_total_s``.

        ``trial.restore_path`` stays until the trial commits a checkpoint of its own:
        until then a retry must start from it too, and retention must not delete it (a
        PBT donor may be committing newer checkpoints while this attempt still reads it).
        """
        restore = trial.restore_path or trial.checkpoint
        meta = self._restore_meta.pop(trial.trial_id, None) if trial.restore_path else None
        return restore, meta or self.restore_meta(trial, restore)

    def restore_meta(self, trial: Trial, path: str | None) -> dict[str, Any]:
        if not path:
            return {}
        for info in trial.checkpoints:
            if info["path"] == path:
                return {"training_iteration": info.get("iteration", 0),
                        "time_total_s": info.get("time_total_s", 0.0)}
        manifest = self.storage.read_manifest(path) or {}
        return {"training_iteration": manifest.get("training_iteration", 0),
                "time_total_s": manifest.get("time_total_s", 0.0)}

    def next_index(self, trial: Trial) -> int:
        """The index of ``trial``'s next checkpoint folder (past the folders a restore
        deleted too: a name is not used twice while a writer of the old one may live)."""
        indices = (checkpoint_index(info["path"]) for info in trial.checkpoints)
        return max(max((i for i in indices if i is not None), default=-1) + 1,
                   self._index_floor.get(trial.trial_id, 0))

    # ------------------------------------------------------------- retention
    def unpin_restore(self, trial: Trial) -> None:
        """Forget where ``trial`` was to restore from; the trial (a PBT donor) that owns
        that checkpoint may now delete it, so its retention runs again."""
        path, trial.restore_path = trial.restore_path, None
        if not path:
            return
        for owner in self._trials:
            if owner is not trial and any(c["path"] == path for c in owner.checkpoints):
                self.enforce_retention(owner)
                return

    def _wanted(self) -> set[str]:
        """Checkpoints another trial is about to restore from or clone (PBT): kept."""
        wanted = {t.restore_path for t in self._trials if t.restore_path}
        wanted |= {e.checkpoint for e in self._exploits.values()}
        return wanted

    def drop_superseded(self, trial: Trial, paths: list[str]) -> None:
        """Delete checkpoint folders of ``trial`` that no resume will use (a restore
        found them: an older attempt's, uncommitted ones, orphans ahead of the logged
        results), unless another trial restores from one; then apply retention, so
        ``num_to_keep`` holds across restores."""
        wanted = self._wanted() | {c["path"] for c in trial.checkpoints}
        for path in paths:
            if path not in wanted:
                self.storage.delete(path)
            index = checkpoint_index(path)
            if index is not None:
                self._index_floor[trial.trial_id] = max(
                    index + 1, self._index_floor.get(trial.trial_id, 0))
        self.enforce_retention(trial)

    def enforce_retention(self, trial: Trial) -> None:
        keep = self.config.num_to_keep
        if keep is None or len(trial.checkpoints) <= keep:
            return
        attr = self.config.checkpoint_score_attribute
        order = self.config.checkpoint_score_order
        # Never delete the newest one, nor one another trial is about to clone (PBT).
        wanted = self._wanted()
        candidates = [c for c in trial.checkpoints
                      if c["path"] != trial.checkpoint and c["path"] not in wanted]

        def score(c: dict[str, Any]) -> float:
            if attr is None:
                return float(c["iteration"])  # keep the newest
            v = c["metrics"].get(attr)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return float("-inf")
            return float(v) if order == "max" else -float(v)

        candidates.sort(key=score)
        excess = len(trial.checkpoints) - keep
        for victim in candidates[:excess]:
            trial.checkpoints.remove(victim)
            self.storage.delete(victim["path"])
