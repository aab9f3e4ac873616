"""What the executor's events do to trials: reports, verdicts, ends, losses, failures.

This is the half of :class:`~dasktune.driver.controller.TuneController` that reacts
(the other half starts trials and runs the loop); it is a base class of the controller
and uses its parts: the trial index, the checkpoint book, the failure policy, the
queue-ahead lines and the callbacks.

Where a report travels: ``tune.report`` (worker) -> actor buffer -> executor poll ->
:class:`~dasktune.execution.ExecEvent` -> :meth:`TrialEvents._on_reports` -> callbacks
(``result.json``, ``progress.csv``, TensorBoard, dashboard) -> searcher -> scheduler
(a :data:`~dasktune.driver.decisions.Verdict`) -> stopper -> :meth:`TrialEvents._apply`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from dasktune.driver.decisions import Continue, EndedBy, Pause, Stop, Verdict, Winding, decide
from dasktune.driver.gang_queue import note_gang
from dasktune.execution import EventKind, ExecEvent, Report
from dasktune.result import AUTO_RESULT_KEYS, EARLY_STOPPED, SHOULD_CHECKPOINT, reported_keys
from dasktune.results import TuneError
from dasktune.schedulers import Exploit, Reconfigure
from dasktune.trainable import is_class_trainable
from dasktune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED, Placement, Trial

if TYPE_CHECKING:
    from dasktune.driver.controller import TuneController

__all__ = ["TrialEvents"]

logger = logging.getLogger(__name__)

_ATTEMPT_ENDS = (EventKind.FINISHED, EventKind.LOST, EventKind.START_FAILED)
_GANG_EVENTS = (EventKind.WORKERS_WANTED, EventKind.WORKERS_WITHDRAWN,
                EventKind.WORKERS_RELEASED, EventKind.GANG_LOST)
# Windings that end in PAUSED.
_PAUSED_BY = (Winding.PAUSING, Winding.RECONFIGURING)


class TrialEvents:
    """Event handlers of the driver loop (a base of ``TuneController``)."""

    def _on_event(self: TuneController, event: ExecEvent) -> None:
        kind = event.kind
        if kind is EventKind.WORKER_LOST:
            self.executor.lose_worker(event.worker)
            self._retiring.discard(event.worker)  # gone: nothing left to retire
            return
        if kind is EventKind.WORKER_ADDED:
            return  # the step refills slots after any event but reports
        if kind is EventKind.WORKER_RETIRING:
            moved = self.move_trials_off(event.worker)
            logger.info("worker %s is retiring: moving trials %s", event.worker, moved)
            self._retiring.add(event.worker)
            self._retire_freed()
            return
        trial = self._by_id.get(event.trial_id)
        if trial is None or event.attempt != trial.attempt:
            logger.debug("dropping %s from stale attempt %s of %s", kind.value, event.attempt,
                         event.trial_id)
            return
        if kind in _GANG_EVENTS:
            self._on_gang_event(trial, event)
            return
        if kind is EventKind.UNQUEUED:
            ahead = self.lines.on_unqueued(trial.trial_id)
            if ahead is not None and self._queue_next:
                self.lines.extend(ahead)
            self.saves.dirty = True  # PENDING again, to start in the next free slot
            return
        if kind in _ATTEMPT_ENDS:
            self.lines.on_ended(trial.trial_id)
            self.gangs.withdraw(trial.trial_id)
        if kind is EventKind.STARTED:
            self._on_started(trial, event)
        elif kind is EventKind.REPORTS or kind is EventKind.FINISHED:
            self._on_reports(trial, event.reports)
            if kind is EventKind.FINISHED:
                self._on_finished(trial, event.error)
        elif kind is EventKind.LOST:
            self._on_lost(trial, event.error or "worker lost")
        elif kind is EventKind.START_FAILED:
            self._end_placement(trial, "error")
            self.executor.release(trial.trial_id)
            self._on_user_error(trial, event.error or "trial actor failed to start")

    def _on_gang_event(self: TuneController, trial: Trial, event: ExecEvent) -> None:
        """A trial's gang request, withdrawal or release, or a gang worker lost."""
        kind = event.kind
        if kind is EventKind.WORKERS_WANTED and event.request is not None:
            if self.gangs.want(trial, event.request) and self._queue_next:
                self._queue_next = False  # a queued attempt would start without its gang
                self.lines.unqueue_all()
        elif kind is EventKind.WORKERS_WITHDRAWN and event.request is not None:
            self.gangs.withdraw(trial.trial_id, event.request.request_id)
        else:
            if kind is EventKind.GANG_LOST:
                logger.info("trial %s: %s; it runs on and may reserve a fresh gang",
                            trial.trial_id, event.error)
            note_gang(trial, None)
            self._retire_freed()  # a gang on a retiring worker held its retirement
        self.saves.dirty = True

    def _on_started(self: TuneController, trial: Trial, event: ExecEvent) -> None:
        if trial.trial_id in self.lines.queued:
            self._on_queued_started(trial, event)
        elif trial.placements:
            p = trial.placements[-1]
            p.host = event.host or p.host
        if self._queue_next and trial.status == RUNNING:
            self.lines.extend(trial.trial_id)
        self.callbacks.on_trial_start(iteration=self._iteration, trials=self.trials,
                                      trial=trial)
        if trial.checkpoint and trial.attempt > 1:
            self.callbacks.on_trial_restore(iteration=self._iteration, trials=self.trials,
                                            trial=trial)

    def _on_queued_started(self: TuneController, trial: Trial, event: ExecEvent) -> None:
        """A queued trial took over its predecessor's actor: it runs now."""
        self.lines.on_started(trial.trial_id)
        self._set_status(trial, RUNNING)
        trial.placements.append(Placement(attempt=trial.attempt, worker=event.worker,
                                          host=event.host, start=time.time()))
        self.saves.dirty = True
        if self._stop_all:  # taken back too late: stop it (left resumable at shutdown)
            self._wind_down(trial, Winding.STOPPING)
        elif event.worker in self._retiring:
            self._wind_down(trial, Winding.MOVING, checkpoint=True)

    # ------------------------------------------------------------- reports
    def _on_reports(self: TuneController, trial: Trial, reports: list[Report]) -> None:
        for report in reports:
            result, ckpt = report.result, report.checkpoint
            if ckpt:
                self.book.register(trial, ckpt, result)
                self.saves.dirty = True
            winding = self._winding.get(trial.trial_id)
            if result is None or trial.status != RUNNING or \
                    winding in (Winding.STOPPING, Winding.EXPLOITING, Winding.RECONFIGURING):
                continue
            it = int(result.get("training_iteration", 0))
            if it <= trial.logged_iteration:
                continue  # re-executed after a restart: logged once already
            self.num_reports += 1
            # Like Ray, a result with only auto-filled keys (a bare ``{"done": True}`` from
            # step() or a returned dict) carries no metric: not checked, not judged.
            auto_only = all(k in AUTO_RESULT_KEYS for k in result)
            if self.metric is not None and not auto_only and \
                    not self._has_metrics(trial, result):
                continue
            trial.update_last_result(result)
            trial.logged_iteration = it
            self.saves.dirty = True
            self.callbacks.on_trial_result(iteration=self._iteration, trials=self.trials,
                                           trial=trial, result=result)
            if result.pop(SHOULD_CHECKPOINT, False):  # a Callback asked (Ray's idiom)
                self._checkpoint_on_demand(trial)
            raw = None  # nothing for a scheduler to judge (as Ray's ASHA skips it)
            if winding is None and not auto_only:
                # The scheduler first, as in Ray: what it adds to the result (the budget of
                # HyperBandForBOHB) reaches the searcher.
                raw = self.scheduler.on_trial_result(self._ctx, trial, result)
            self.search_alg.on_trial_result(trial.trial_id, result)
            try:
                # Its own "done" (the trainable's, or the stop dict's on the worker), else
                # a driver-side stopper's.
                done = EndedBy.TRAINABLE if result.get("done") else \
                    EndedBy.STOPPER if self.stopper(trial.trial_id, result) else None
            except ValueError as exc:
                self._stop_with_error(trial, str(exc))
                continue
            if winding is not None:
                # Pausing or moving: it runs on only to its checkpoint, but a reached
                # stop criterion still ends it here.
                if done is not None:
                    del self._winding[trial.trial_id]
                    self._apply(trial, Stop(done), result)
                continue
            # The scheduler saw every result it may judge, the last one too.
            verdict: Verdict = Stop(done) if done is not None else decide(raw, trial.trial_id)
            self._apply(trial, verdict, result, checkpointed=bool(ckpt))
        if self.stopper.stop_all():
            self._stop_everything("stopper.stop_all() returned True")

    def _has_metrics(self: TuneController, trial: Trial, result: dict[str, Any]) -> bool:
        metrics = self.metric if isinstance(self.metric, (list, tuple)) else [self.metric]
        for m in metrics:
            if m not in result:
                self._stop_with_error(
                    trial,
                    f"trial {trial.trial_id} reported a result without the metric {m!r} "
                    f"set in TuneConfig ({reported_keys(result)})",
                )
                return False
        return True

    def _checkpoint_on_demand(self: TuneController, trial: Trial) -> None:
        if is_class_trainable(self.trainable):
            self.executor.checkpoint(trial.trial_id)
        elif not self._warned_on_demand:
            self._warned_on_demand = True
            logger.warning(
                "a Callback set SHOULD_CHECKPOINT for trial %s, but a function trainable "
                "is checkpointed only when it passes checkpoint= to tune.report; ignored",
                trial.trial_id)

    def _apply(self: TuneController, trial: Trial, verdict: Verdict, result: dict[str, Any],
               checkpointed: bool = False) -> None:
        if isinstance(verdict, Continue):
            return
        if isinstance(verdict, Pause):
            # This very result came with a checkpoint: pause right here (as Ray does, at
            # the milestone), not after one more iteration and checkpoint.
            self._wind_down(trial, Winding.PAUSING, checkpoint=not checkpointed)
        elif isinstance(verdict, Stop):
            self._complete(trial, result, verdict.by)
            self._wind_down(trial, Winding.STOPPING)
        elif isinstance(verdict, Reconfigure):
            # Applied once the attempt has stopped (_take_reconfigure); at a checkpointed
            # result the trial pauses right here.
            self._reconfigure[trial.trial_id] = verdict
            self._wind_down(trial, Winding.RECONFIGURING if checkpointed else Winding.PAUSING,
                            checkpoint=not checkpointed)
        elif isinstance(verdict, Exploit):
            self.book.hold_for_exploit(trial, verdict)
            if verdict.policy is not None:
                self.callbacks.on_trial_exploit(iteration=self._iteration, trials=self.trials,
                                                trial=trial, exploit=verdict)
            self._wind_down(trial, Winding.EXPLOITING)

    # ------------------------------------------------------------- ends
    def _release(self: TuneController, trial: Trial) -> None:
        self.executor.release(trial.trial_id)  # its gangs too
        self._retire_freed()

    def _retire_freed(self: TuneController) -> None:
        """Retire the retiring workers that no trial or gang of ours holds any more."""
        for worker in list(self._retiring):
            if self.executor.retire_when_free(worker):
                self._retiring.discard(worker)

    def _on_finished(self: TuneController, trial: Trial, error: str | None) -> None:
        winding = self._winding.pop(trial.trial_id, None)
        self._release(trial)
        self._take_reconfigure(trial, apply=winding in _PAUSED_BY and not error)
        if error and winding is not Winding.STOPPING:
            self._end_placement(trial, "error")
            self._on_user_error(trial, error)
            return
        if winding in _PAUSED_BY:
            self._end_placement(trial, "paused")
            self._set_status(trial, PAUSED)
        elif winding is Winding.EXPLOITING:
            self._end_placement(trial, "exploited")
            self.book.carry_out_exploit(trial, self._by_id)
            self._set_status(trial, PENDING)
        elif winding is Winding.MOVING:
            self._end_placement(trial, "moved")
            self._set_status(trial, PENDING)
        elif winding is Winding.STOPPING:
            self._end_placement(trial, "stopped")
        else:
            self._end_placement(trial, "done")
            self.lines.note_run_time(trial)
            self._complete(trial, None)
        self.saves.dirty = True

    def _take_reconfigure(self: TuneController, trial: Trial, apply: bool) -> None:
        """A pausing trial's Reconfigure: its new config and resources take effect now that
        it has stopped (its next start is placed with them)."""
        change = self._reconfigure.pop(trial.trial_id, None)
        if change is None or not apply:
            return
        if change.config is not None:
            trial.config = dict(change.config)
        if change.resources is not None:
            trial.resources = dict(change.resources)

    def _on_lost(self: TuneController, trial: Trial, why: str) -> None:
        tid = trial.trial_id
        winding = self._winding.get(tid)
        self.book.drop_exploit(trial)
        self._take_reconfigure(trial, apply=winding in _PAUSED_BY)
        self._end_placement(trial, "lost")
        self.executor.release(tid)
        if not trial.is_finished and winding in (None, Winding.MOVING, Winding.PAUSING):
            # A move or pause commits its checkpoint just before the worker may go: adopt
            # it while the winding still stands, so its result isn't a scheduler decision.
            report = self.book.unreported(trial)
            if report is not None:
                self._on_reports(trial, [report])
            else:
                self.saves.dirty = True
        self._winding.pop(tid, None)
        if trial.is_finished:
            return
        error = self.failures.worker_loss_error(trial, winding is Winding.MOVING, why)
        if error is not None:
            self._error(trial, error)
            return
        logger.info("trial %s: %s; restarting from %s", tid, why,
                    trial.checkpoint or "scratch")
        self._set_status(trial, PAUSED if winding in _PAUSED_BY else PENDING)
        self.callbacks.on_trial_recover(iteration=self._iteration, trials=self.trials,
                                        trial=trial)
        self.saves.dirty = True

    def _on_user_error(self: TuneController, trial: Trial, error: str) -> None:
        if self.failures.retries_user_error(trial):
            trial.error_msg = error
            self._set_status(trial, PENDING)
            self.callbacks.on_trial_recover(iteration=self._iteration, trials=self.trials,
                                            trial=trial)
            return
        self._error(trial, error)

    def _end_placement(self: TuneController, trial: Trial, outcome: str) -> None:
        if trial.placements and trial.placements[-1].end is None:
            trial.placements[-1].end = time.time()
            trial.placements[-1].outcome = outcome

    # ------------------------------------------------------------- endings
    def _complete(self: TuneController, trial: Trial, result: dict[str, Any] | None,
                  by: EndedBy = EndedBy.TRAINABLE, why: str = "") -> None:
        """TERMINATED: the trial is done (its attempt may still be winding down). Ended
        by the driver (``by``, ``why``), the end is recorded in storage first."""
        if trial.is_finished:
            return
        early_stopped = by is EndedBy.SCHEDULER
        if early_stopped:
            trial.stop_reason = "early_stopped"
            trial.stop_rung = self._rung(result or trial.last_result)
        trial.last_result = dict(trial.last_result, done=True) if trial.last_result else {}
        if by is not EndedBy.TRAINABLE:
            self._record_end(trial, by, why)
        self._set_status(trial, TERMINATED)
        self.book.unpin_restore(trial)  # nothing will restore it: its donor's may go
        self.executor.withdraw(trial.trial_id)  # stopped while it waited for resources
        final = dict(result or trial.last_result)
        self.scheduler.on_trial_complete(self._ctx, trial, final)
        if early_stopped:
            final[EARLY_STOPPED] = True
        self.search_alg.on_trial_complete(trial.trial_id, result=final)
        self.callbacks.on_trial_complete(iteration=self._iteration, trials=self.trials,
                                         trial=trial)
        self.saves.soon()

    def _rung(self: TuneController, result: dict[str, Any]) -> dict[str, Any] | None:
        """Where a scheduler stopped a trial: its ``time_attr`` and the value the trial
        had reached (the rung), or None if the scheduler has no ``time_attr``."""
        attr = self.scheduler.time_attr
        value = result.get(attr) if attr else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return {"time_attr": attr, "value": value}

    def _record_end(self: TuneController, trial: Trial, by: EndedBy, why: str) -> None:
        """Write the trial-end marker of a trial the driver ended, before anything else
        says it ended: a driver killed after this is restored with the trial TERMINATED
        (its worker records the end of a trial that ended itself)."""
        if not trial.path:
            return
        rung = trial.stop_rung if by is EndedBy.SCHEDULER else None
        reason = why or (f"{type(self.stopper).__name__} said stop" if by is EndedBy.STOPPER
                         else "the experiment ended")
        if by is EndedBy.SCHEDULER:
            reason = f"{type(self.scheduler).__name__} stopped it early" + (
                f" at {rung['time_attr']} {rung['value']:g}" if rung else "")
        try:
            self.storage.write_trial_end(
                trial.path, trial_id=trial.trial_id, attempt=trial.attempt,
                result=trial.last_result, ended_by=by.value, reason=reason, rung=rung)
        except Exception:  # noqa: BLE001 - a storage outage must not end the experiment
            logger.warning("trial %s: its end could not be recorded in storage",
                           trial.trial_id, exc_info=True)

    def _stop_with_error(self: TuneController, trial: Trial, message: str) -> None:
        """End a trial for a mistake no retry can fix (e.g. a missing metric)."""
        self._error(trial, message)
        self._wind_down(trial, Winding.STOPPING)

    def _error(self: TuneController, trial: Trial, error: str) -> None:
        if trial.is_finished:
            return
        trial.error_msg = error
        self._set_status(trial, ERROR)
        self.executor.withdraw(trial.trial_id)
        self.scheduler.on_trial_error(self._ctx, trial)
        self.search_alg.on_trial_complete(trial.trial_id, result=None, error=True)
        self.callbacks.on_trial_error(iteration=self._iteration, trials=self.trials, trial=trial)
        self.saves.soon()
        fail_fast = self.failures.fail_fast
        if fail_fast:
            self._stop_everything(f"trial {trial.trial_id} errored and fail_fast is set")
            if fail_fast == "raise" and self._raise is None:
                self._raise = TuneError(f"trial {trial.trial_id} failed:\n{error}")

    def _wind_down(self: TuneController, trial: Trial, why: Winding,
                   checkpoint: bool = False) -> None:
        """Ask ``trial``'s attempt to end (after a checkpoint), remembering ``why``."""
        self._winding[trial.trial_id] = why
        self.executor.stop(trial.trial_id, checkpoint=checkpoint)

    # ------------------------------------------------------------- moves
    def move_trials_off(self: TuneController, worker: str) -> list[str]:
        """Checkpoint and restart elsewhere every trial on a retiring worker."""
        moved = []
        for tid in self.executor.running_on(worker):
            trial = self._by_id.get(tid)
            if trial is None or trial.status != RUNNING or tid in self._winding:
                continue
            self._wind_down(trial, Winding.MOVING, checkpoint=True)
            moved.append(tid)
            for queued in list(self.lines.successors(tid)):
                self.executor.unqueue(queued)  # they must not start on this worker
        return moved
