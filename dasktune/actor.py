"""The trial actor: one attempt of one trial, living on a Dask worker.

The user's code runs in a thread of its own (Dask runs all actors' synchronous
methods on one shared thread, so a training loop there would stall every other
trial on the worker). The actor's methods are ``async`` and short: they run on the
worker's event loop and never block it.

Reports go into a bounded buffer. The driver long-polls :meth:`TrialActor.poll`,
which returns every report after the one it acknowledged; a report leaves the
buffer only once acknowledged, so a lost poll reply loses nothing. When the buffer
is full, ``tune.report`` waits: memory stays bounded and nothing is dropped.

A driver may queue the next attempt behind the running one (:meth:`TrialActor.enqueue`):
the poll that reports the end of the running attempt starts the queued one on the
spot, so a short trial's slot never idles for a round trip through the driver.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections import deque
from typing import Any

from dasktune import _dask_config, isolation
from dasktune.checkpoint import Checkpoint
from dasktune.result import SHOULD_CHECKPOINT
from dasktune.session import StopTrial, TrialSession, TrialSpec, _bind
from dasktune.trainable import is_class_trainable

_MAX_BATCH = 1000
_LINGER = 0.002
# A running trial's driver polls it every poll-wait (0.2 s): silence this long means
# nobody will collect its reports, so a closing worker need not wait for them.
_DRIVER_GONE_S = 2.0
_TRAINABLES: dict[bytes, Any] = {}


def _load_trainable(blob: bytes) -> Any:
    """Unpickle the trainable once per worker process (it arrives with every attempt)."""
    import hashlib

    import cloudpickle

    key = hashlib.blake2b(blob, digest_size=16).digest()
    fn = _TRAINABLES.get(key)
    if fn is None:
        fn = _TRAINABLES[key] = cloudpickle.loads(blob)
    return fn


class TrialActor:
    """Runs one attempt of a trial; created with ``client.submit(TrialActor, spec, params, actor=True)``."""

    def __init__(self, spec: TrialSpec, params: dict[str, Any] | None = None):
        if isinstance(spec.trainable, bytes):
            spec.trainable = _load_trainable(spec.trainable)
        self.spec = spec
        self._params = params or {}
        self._cond = threading.Condition()
        self._buffer: deque[tuple[int, dict[str, Any] | None, str | None]] = deque()
        self._seq = 0
        self._acked = 0
        self._finished = False
        self._error: str | None = None
        self._stop_now = threading.Event()
        # Set with _stop_now when no driver will collect this attempt (its task left the
        # worker, or no poll came): unlike a driver's stop, it commits nothing more.
        self._fenced = threading.Event()
        self.fenced_reason: str | None = None
        self._stop_after_checkpoint = threading.Event()
        self._checkpoint_now = threading.Event()  # a driver-side request (Callback)
        self._kept: Any = None  # a class trainable's instance, kept for reuse_actors
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._ended: asyncio.Event | None = None  # set when the attempt's thread ends
        self._wake_pending = False  # a wake-up is on its way to the poll
        self._last_poll = time.monotonic()
        self._next: TrialSpec | None = None  # queued behind this attempt (enqueue)
        self._end_reported = False  # a poll has told the driver this attempt ended

    # ------------------------------------------------------------ actor API
    async def start(self, spec: TrialSpec | None = None) -> dict[str, Any]:
        """Start the user's code in its own thread; returns where it runs. With ``spec``,
        a reused actor first takes that attempt (:meth:`reset`): one round trip."""
        if spec is not None:
            await self.reset(spec)
        return self._launch()

    def _launch(self) -> dict[str, Any]:
        """Start the current attempt's thread (on the worker's event loop)."""
        from distributed import get_worker

        worker = get_worker()
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._ended = asyncio.Event()
        self._thread = threading.Thread(
            target=self._run, args=(worker.address,), daemon=True,
            name=f"dasktune-trial-{self.spec.trial_id}-{self.spec.attempt}",
        )
        self._thread.start()
        self._last_poll = time.monotonic()
        self._watchdog = asyncio.ensure_future(self._orphan_watchdog(self._thread))
        return {"pid": os.getpid(), "host": socket.gethostname(), "worker": worker.address}

    async def enqueue(self, spec: TrialSpec) -> bool:
        """Queue ``spec`` to start as soon as the running attempt ends (see the module
        docs). False, and nothing queued, if the driver already knows it ended, or
        another attempt is queued: the driver then starts ``spec`` the usual way."""
        if self._end_reported or self._next is not None or self._thread is None:
            return False
        self._next = spec
        return True

    async def unqueue(self, trial_id: str) -> bool:
        """Drop the queued attempt of ``trial_id``; False if it has started (or was
        never queued here)."""
        if self._next is not None and self._next.trial_id == trial_id:
            self._next = None
            return True
        return False

    async def _orphan_watchdog(self, thread: threading.Thread) -> None:
        """Stop the trial when no driver has polled for a while (the driver died): an
        orphan would go on committing checkpoints that no driver logged."""
        timeout = _dask_config.get_seconds("executor.orphan-timeout")
        while thread.is_alive() and self._thread is thread:
            await asyncio.sleep(min(1.0, timeout / 4))
            if time.monotonic() - self._last_poll > timeout and self._thread is thread:
                self.fence(f"no driver polled it for {timeout:.0f}s")
                return

    def fence(self, reason: str) -> None:
        """Stop the attempt at its next report or step boundary, for good: no driver will
        collect it, so it must commit no further checkpoint (a restored driver's new
        attempt writes into the same trial folder). Called on the worker's event loop
        by :class:`~dasktune.recovery.FencePlugin` and by the orphan watchdog."""
        if self.fenced_reason is None:
            self.fenced_reason = reason
        self._next = None  # this actor is being dropped: start nothing more on it
        self._fenced.set()
        self._stop_now.set()
        with self._cond:
            self._cond.notify_all()

    async def poll(self, ack: int, wait: float = 0.2, attempt: str | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        """Drop reports up to ``ack``; return the next ones (waiting up to ``wait`` s),
        at most ``limit`` of them (0: none, a keep-alive that still reports the end
        once nothing is left to send).

        ``attempt`` (``"<trial_id>:<attempt>"``) fences a late poll of the attempt this
        actor ran before it was reused: its ``ack`` must not drop the new attempt's reports.
        """
        assert self._wakeup is not None
        if attempt is not None and attempt != f"{self.spec.trial_id}:{self.spec.attempt}":
            return {"reports": [], "finished": False, "error": None}
        self._last_poll = time.monotonic()
        with self._cond:
            self._acked = max(self._acked, ack)
            while self._buffer and self._buffer[0][0] <= ack:
                self._buffer.popleft()
            self._cond.notify_all()
            empty = not self._buffer and not self._finished
            if empty:
                self._wakeup.clear()
                self._wake_pending = False
        if empty and wait > 0:
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
                if not self.spec.sync_reports and not self._finished:
                    # Linger a moment so a fast trial's reports travel in batches, but
                    # not past its end: its slot waits for this reply.
                    assert self._ended is not None
                    await asyncio.wait_for(self._ended.wait(), _LINGER)
            except asyncio.TimeoutError:
                pass
        if attempt is not None and attempt != f"{self.spec.trial_id}:{self.spec.attempt}":
            return {"reports": [], "finished": False, "error": None}
        with self._cond:
            n = _MAX_BATCH if limit is None else min(limit, _MAX_BATCH)
            batch = [item for _, item in zip(range(n), self._buffer)]
            finished = self._finished and len(batch) == len(self._buffer)
            reply = {"reports": batch, "finished": finished,
                     "error": self._error if finished else None}
        if finished:
            # The reply carries the attempt's last reports (they need no ack): from here
            # the actor may take the queued attempt.
            self._end_reported = True
            if self._next is not None:
                spec, self._next = self._next, None
                if self._thread is not None:
                    self._thread.join(1.0)  # it is past _finished: only its wake-up is left
                stale = self._reset_now(spec)
                if stale is not None:
                    asyncio.ensure_future(asyncio.to_thread(stale.stop))
                reply["next"] = self._launch()
        return reply

    async def reset(self, spec: TrialSpec) -> None:
        """Take a new attempt (of any trial) once the previous one has ended."""
        stale = self._reset_now(spec)
        if stale is not None:
            await asyncio.to_thread(stale.stop)

    def _reset_now(self, spec: TrialSpec) -> Any:
        """Become a fresh actor for ``spec``; returns a kept instance the new attempt
        cannot reuse (for the caller to stop off the event loop), or None."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the previous trial of this actor is still running")
        kept = self._kept
        self.__init__(spec, self._params)  # type: ignore[misc]
        if kept is not None:
            if spec.reuse_instance and type(kept) is self.spec.trainable:
                self._kept = kept  # offered to the new trial through reset_config
                return None
            return kept
        return None

    async def close(self) -> None:
        """The actor is being dropped: clean up an instance kept for reuse."""
        kept, self._kept = self._kept, None
        if kept is not None:
            await asyncio.to_thread(kept.stop)

    async def stop(self, checkpoint: bool = False) -> None:
        """End the attempt: at once, or after its next checkpoint (``checkpoint=True``).

        A class trainable saves one at its next step boundary; a function trainable
        runs on until it reports its next checkpoint.
        """
        if checkpoint:
            self._stop_after_checkpoint.set()
        else:
            self._stop_now.set()
        with self._cond:
            self._cond.notify_all()

    async def checkpoint(self) -> None:
        """Save a checkpoint after the step in flight and go on (a class trainable; a
        Callback set ``SHOULD_CHECKPOINT`` in a result the driver saw)."""
        self._checkpoint_now.set()

    async def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def evacuated(self) -> bool:
        """Whether the worker may close: the attempt ended (or never started) and the
        driver acknowledged its every report, or no driver polls it any more (read by
        the worker's evacuate plugin)."""
        if self._thread is None or time.monotonic() - self._last_poll > _DRIVER_GONE_S:
            return True
        with self._cond:
            return not self._thread.is_alive() and not self._buffer

    # ------------------------------------------------------------ runner thread
    def _emit(self, result: dict[str, Any] | None, checkpoint_path: str | None) -> None:
        with self._cond:
            while len(self._buffer) >= self.spec.max_buffered and not self._stop_now.is_set():
                self._cond.wait(1.0)
            self._seq += 1
            seq = self._seq
            self._buffer.append((seq, result, checkpoint_path))
            # Wake the poll once per batch, not per report (each wake is a syscall).
            wake, self._wake_pending = not self._wake_pending, True
        if wake:
            self._wake()
        if self.spec.sync_reports:
            with self._cond:  # until the driver has received it (acked by the next poll)
                while self._acked < seq and not self._stop_now.is_set() and \
                        not self._stop_after_checkpoint.is_set():
                    self._cond.wait(1.0)

    def _wake(self, ended: bool = False) -> None:
        if self._loop is not None and self._wakeup is not None:
            try:
                self._loop.call_soon_threadsafe(self._wakeup.set)
                if ended and self._ended is not None:
                    self._loop.call_soon_threadsafe(self._ended.set)
            except RuntimeError:  # the worker's loop closed: the worker is going away
                pass

    def _should_stop(self, had_checkpoint: bool = False) -> bool:
        if self._stop_now.is_set():
            return True
        return had_checkpoint and self._stop_after_checkpoint.is_set()

    def _run(self, worker_address: str) -> None:
        spec = self.spec
        session = TrialSession(spec, self._emit, self._should_stop, worker_address,
                               fenced=self._fenced.is_set)
        _bind(session)
        try:
            if isolation.wants_process(spec):  # GPUs: a process that sees only its devices
                isolation.run_in_process(self, worker_address)
                return
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpu_ids)
            if is_class_trainable(spec.trainable):
                self._run_class(session)
            else:
                self._run_function(session)
        except StopTrial:
            pass
        except BaseException:  # noqa: BLE001 - the trial's error, reported to the driver
            self._error = traceback.format_exc()
        finally:
            _bind(None)
            session.close()
            with self._cond:
                self._finished = True
            self._wake(ended=True)

    def _run_function(self, session: TrialSession) -> None:
        config = copy.deepcopy(self.spec.config)
        out = self.spec.trainable(config, **self._params)
        if isinstance(out, dict):  # Ray: a returned dict is the final result
            session.report(out)

    def _run_class(self, session: TrialSession) -> None:
        spec = self.spec
        trial_info = {
            "trial_id": spec.trial_id,
            "trial_name": spec.trial_name,
            "logdir": session.local_trial_dir(),
            "resources": {**spec.resources, "gpu_ids": list(spec.gpu_ids)},
            "iteration": session.iteration,
            "time_total_s": session.time_total,
            "params": self._params,
        }
        inst, self._kept = self._kept, None
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
            last_checkpointed = -1
            while True:
                if self._stop_now.is_set():
                    return
                if self._stop_after_checkpoint.is_set():
                    if last_checkpointed != session.iteration:
                        self._save_only(inst, session)
                    return
                result = inst.train()
                done = bool(result.get("done", False))
                want = bool(result.pop(SHOULD_CHECKPOINT, False))
                if self._checkpoint_now.is_set():
                    self._checkpoint_now.clear()
                    want = True
                freq = spec.checkpoint_frequency
                next_iter = session.iteration + 1
                if freq and next_iter % freq == 0:
                    want = True
                if done and spec.checkpoint_at_end:
                    want = True
                ckpt_dir = inst.save(tempfile.mkdtemp(prefix="dasktune-save-")) if want else None
                try:
                    checkpoint = Checkpoint.from_directory(ckpt_dir) if ckpt_dir else None
                    try:
                        session.report(result, checkpoint=checkpoint)
                    except StopTrial:
                        if spec.checkpoint_at_end and ckpt_dir is None and \
                                not self._fenced.is_set():
                            self._save_only(inst, session)
                        return
                finally:
                    if ckpt_dir:
                        shutil.rmtree(ckpt_dir, ignore_errors=True)
                if ckpt_dir:
                    last_checkpointed = session.iteration
                if done:
                    return
        except BaseException:
            clean = False
            raise
        finally:
            if clean and spec.reuse_instance:
                self._kept = inst  # for the next trial on this actor (reuse_actors)
            else:
                inst.stop()

    def _save_only(self, inst: Any, session: TrialSession) -> None:
        """A checkpoint with no new result (pause, graceful move, checkpoint_at_end)."""
        if self._fenced.is_set():
            return  # nobody would log it; a new attempt may already write this trial
        ckpt_dir = inst.save(tempfile.mkdtemp(prefix="dasktune-save-"))
        try:
            path = session.commit_checkpoint(
                Checkpoint.from_directory(ckpt_dir),
                {"training_iteration": session.iteration, "time_total_s": session.time_total},
            )
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        self._emit(None, path)
