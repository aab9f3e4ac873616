"""One attempt of a trial, wherever it runs: its stop flags and the user's code.

:class:`Attempt` is the only code that runs a trainable: the function API's call, and a
class ``Trainable``'s loop with its checkpoint policy (every ``checkpoint_frequency``
iterations, at the end with ``checkpoint_at_end``, when a Callback asks, and a
checkpoint-only save before a pause or a move). The in-thread actor
(:mod:`dasktune.actor`) and the isolated child process (:mod:`dasktune.isolation`) both
run their attempts through it; the simulated executor has no code to run, and asks the
same policy (:func:`checkpoint_due`) when its trials checkpoint.

The flags are the driver's requests (stop now, stop after the next checkpoint,
checkpoint now) and the fence (stop, and commit nothing more: no driver will collect
this attempt). Whoever runs the attempt sets them; the user's code sees them at its
next ``tune.report`` or step boundary.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dasktune import scratch
from dasktune.checkpoint import Checkpoint
from dasktune.gang_desk import GangDesk
from dasktune.result import SHOULD_CHECKPOINT
from dasktune.session import StopTrial, TrialSession, bind_session
from dasktune.trainable import is_class_trainable, run_function

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["Attempt", "checkpoint_due"]

logger = logging.getLogger(__name__)

#: ``emit(result, checkpoint_path)``: one report of the attempt.
Emit = Callable[[dict[str, Any] | None, str | None], None]


def checkpoint_due(spec: TrialSpec, iteration: int, done: bool) -> bool:
    """Whether the attempt ``spec`` checkpoints at ``iteration`` (``done``: its last)
    by the run's :class:`~dasktune.CheckpointConfig`."""
    freq = spec.checkpoint_frequency
    return bool(freq and iteration % freq == 0) or (done and spec.checkpoint_at_end)


class Attempt:
    """The attempt ``spec``, reporting through ``emit``.

    Args:
        spec: the attempt (its ``trainable`` already unpickled).
        params: ``tune.with_parameters`` values.
        emit: takes each report (may block: the caller's back-pressure).
        cond: notified when a flag changes, for an ``emit`` that waits on it.
        wake: wakes whoever relays the attempt's gang requests to the driver (the
            trial actor's poll); without it the trial cannot reserve workers.
    """

    def __init__(self, spec: TrialSpec, params: dict[str, Any], emit: Emit,
                 cond: threading.Condition | None = None,
                 wake: Callable[[], None] | None = None):
        self.spec = spec
        self.params = params
        self.emit = emit
        self.cond = cond or threading.Condition()
        self.stop_now = threading.Event()
        # Set with stop_now when no driver will collect this attempt (its task left the
        # worker, or no poll came): unlike a driver's stop, it commits nothing more.
        self.fenced = threading.Event()
        self.fenced_reason: str | None = None
        self.stop_after_checkpoint = threading.Event()
        self.checkpoint_now = threading.Event()  # a driver-side request (Callback)
        self.gangs = GangDesk(wake, self._stopping, spec.gang) if wake is not None else None

    # ------------------------------------------------------------ flags
    def request_stop(self, after_checkpoint: bool = False) -> None:
        """End the attempt: at once, or after its next checkpoint."""
        (self.stop_after_checkpoint if after_checkpoint else self.stop_now).set()
        with self.cond:
            self.cond.notify_all()

    def fence(self, reason: str) -> None:
        """Stop for good, committing nothing more (the first reason is kept)."""
        with self.cond:
            if self.fenced_reason is None:
                self.fenced_reason = reason
            self.fenced.set()
            self.stop_now.set()
            self.cond.notify_all()

    def _stopping(self) -> bool:
        """Whether the driver asked the attempt to end, now or at its next checkpoint."""
        return self.stop_now.is_set() or self.stop_after_checkpoint.is_set()

    def should_stop(self, had_checkpoint: bool = False) -> bool:
        if self.stop_now.is_set():
            return True
        return had_checkpoint and self.stop_after_checkpoint.is_set()

    # ------------------------------------------------------------ running
    def run(self, worker_address: str, kept: Any = None) -> tuple[str | None, Any]:
        """Run the user's code to its end in this thread, with ``CUDA_VISIBLE_DEVICES``
        set to the attempt's devices. Returns the error (a traceback) or None, and the
        class trainable's instance to keep for the next trial (``reuse_actors``): ``kept``
        is offered to this one through ``reset_config``."""
        session = TrialSession(self.spec, self.emit, self.should_stop, worker_address,
                               fenced=self.fenced.is_set, gangs=self.gangs)
        bind_session(session)
        error, keep = None, None
        # The trial ended by itself: the function returned, or a result said done (its
        # own ``done`` or the stop dict); not a driver's stop, pause or move.
        ended = False
        try:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.spec.gpu_ids)
            if is_class_trainable(self.spec.trainable):
                keep = self._run_class(session, kept)
                ended = session.done
            else:
                self._run_function(session)
                ended = True
        except StopTrial:
            ended = session.done
        except BaseException:  # noqa: BLE001 - the trial's error, reported to the driver
            error = traceback.format_exc()
        try:
            if ended:
                # Durable before the attempt reports its end (as checkpoints are):
                # a driver killed before it saved the end does not run it again.
                session.record_end()
        except Exception:  # noqa: BLE001 - the driver still hears of the end
            logger.warning("trial %s: its end could not be recorded in storage",
                           self.spec.trial_id, exc_info=True)
        finally:
            bind_session(None)
            if self.gangs is not None:
                self.gangs.close()
            session.close(failed=error is not None)
        return error, keep

    def _run_function(self, session: TrialSession) -> None:
        config = copy.deepcopy(self.spec.config)
        # Ray's handling of what it returns or yields: a dict is a result, a number _metric.
        run_function(self.spec.trainable, config, self.params, session.report)

    def _run_class(self, session: TrialSession, kept: Any) -> Any:
        """The class API's loop; returns the instance to keep (``reuse_instance``)."""
        spec = self.spec
        trial_info = {
            "trial_id": spec.trial_id,
            "trial_name": spec.trial_name,
            "logdir": session.local_trial_dir(),
            "resources": {**spec.resources, "gpu_ids": list(spec.gpu_ids)},
            "iteration": session.iteration,
            "time_total_s": session.time_total,
            "params": self.params,
        }
        inst = kept
        if inst is not None and not inst.reset(copy.deepcopy(spec.config), trial_info):
            inst.stop()  # reset_config said no: a fresh instance, as Ray does
            inst = None
        if inst is None:
            inst = spec.trainable(copy.deepcopy(spec.config), trial_info=trial_info)
        clean = True  # ended without an exception: the instance may be reused
        try:
            if spec.restore_path:
                with Checkpoint(spec.restore_path, spec.storage.fs).as_directory() as local:
                    inst.restore(local)
            self._train(inst, session)
        except BaseException:
            clean = False
            raise
        finally:
            if not (clean and spec.reuse_instance):
                inst.stop()
        return inst if spec.reuse_instance else None

    def _train(self, inst: Any, session: TrialSession) -> None:
        """Step ``inst`` until it is done or stopped, checkpointing as the policy says."""
        spec = self.spec
        last_checkpointed = -1
        while True:
            if self.stop_now.is_set():
                return
            if self.stop_after_checkpoint.is_set():
                if last_checkpointed != session.iteration:
                    self._save_only(inst, session)
                return
            result = inst.train()
            done = bool(result.get("done", False))
            want = bool(result.pop(SHOULD_CHECKPOINT, False))
            if self.checkpoint_now.is_set():
                self.checkpoint_now.clear()
                want = True
            if checkpoint_due(spec, session.iteration + 1, done):
                want = True
            ckpt_dir = inst.save(scratch.mkdtemp("dasktune-save-")) if want else None
            try:
                checkpoint = Checkpoint.from_directory(ckpt_dir) if ckpt_dir else None
                try:
                    session.report(result, checkpoint=checkpoint)
                except StopTrial:
                    if spec.checkpoint_at_end and ckpt_dir is None and \
                            not self.fenced.is_set():
                        self._save_only(inst, session)
                    return
            finally:
                if ckpt_dir:
                    shutil.rmtree(ckpt_dir, ignore_errors=True)
            if ckpt_dir:
                last_checkpointed = session.iteration
            if done:
                return

    def _save_only(self, inst: Any, session: TrialSession) -> None:
        """A checkpoint with no new result (pause, graceful move, checkpoint_at_end)."""
        if self.fenced.is_set():
            return  # nobody would log it; a new attempt may already write this trial
        ckpt_dir = inst.save(scratch.mkdtemp("dasktune-save-"))
        try:
            path = session.commit_checkpoint(
                Checkpoint.from_directory(ckpt_dir),
                {"training_iteration": session.iteration, "time_total_s": session.time_total},
            )
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        self.emit(None, path)
