"""The trial actor: one attempt of one trial, living on a Dask worker.

The user's code runs in a thread of its own (Dask runs all actors' synchronous
methods on one shared thread, so a training loop there would stall every other
trial on the worker). The actor's methods are ``async`` and short: they run on the
worker's event loop and never block it.

Reports go into a bounded buffer. The driver long-polls :meth:`TrialActor.poll`,
which returns every report after the one it acknowledged; a report leaves the
buffer only once acknowledged, so a lost poll reply loses nothing. When the buffer
is full, ``tune.report`` waits: memory stays bounded and nothing is dropped.

A driver may queue attempts behind the running one (:meth:`TrialActor.enqueue`): the
thread that ran the attempt runs the next in line as soon as the user's code returns,
so a short trial's slot never idles for a round trip through the driver, nor for a
wake-up of the worker's event loop and a new thread. The ended attempt's last reports
wait for the driver's next poll of it, which also learns that the queued one started.

The poll replies also carry the trial's gang requests (:mod:`dasktune.gang_desk`), and
the driver's answers come back through :meth:`TrialActor.grant` and its neighbours.
Over ~400 lines because the poll, the queued attempts and the thread that runs them
share one lock and one attempt record.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import socket
import threading
import time
import traceback
from collections import deque
from typing import Any

from dasktune import _dask_config, isolation, scratch
from dasktune.attempt import Attempt
from dasktune.session import TrialSpec

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
        self._params = params or {}
        self._cond = threading.Condition()
        self._kept: Any = None  # a class trainable's instance, kept for reuse_actors
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._ended: asyncio.Event | None = None  # set when an attempt's code ends
        self._where: dict[str, Any] = {}  # what start() returned: pid, host, worker
        self._cluster: tuple[str, Any] | None = None  # the worker's scheduler, security
        self._last_poll = time.monotonic()
        self._replied = 0.0  # when a poll's reply last carried reports
        # Attempts that ended in the thread that went on to their queued successors,
        # each until a poll has handed its last reports to the driver (see _hand_over);
        # several when short trials end faster than the driver polls.
        self._ended_attempts: dict[str, _Ended] = {}
        # Attempts queued behind the running one (enqueue), to run in this order.
        self._next: deque[TrialSpec] = deque()
        self._new_attempt(spec)

    def _new_attempt(self, spec: TrialSpec) -> None:
        """Reset what belongs to one attempt (the buffer, its flags) for ``spec``."""
        if isinstance(spec.trainable, bytes):
            spec.trainable = _load_trainable(spec.trainable)
        self.spec = spec
        self._key = attempt_key(spec)
        self._buffer: deque[tuple[int, dict[str, Any] | None, str | None]] = deque()
        self._seq = 0
        self._acked = 0
        self._finished = False
        self._error: str | None = None
        # Its stop flags and the user's code (dasktune.attempt); reports come to _emit.
        self._attempt = Attempt(spec, self._params, self._emit, cond=self._cond,
                                wake=self._wake)
        self._wake_pending = False  # a wake-up is on its way to the poll
        self._end_reported = False  # a poll has told the driver this attempt ended

    def _is(self, attempt: str | None) -> bool:
        """Whether a call fenced with ``attempt`` (``"<trial_id>:<attempt>"``) is meant
        for the attempt running now (None: unfenced, always)."""
        return attempt is None or attempt == self._key

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
        scratch.set_root(worker.local_directory)  # removed by Dask if this worker dies
        # Where an isolated attempt's child connects its client (dasktune.isolation).
        self._cluster = (worker.scheduler.address, worker.security)
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._ended = asyncio.Event()
        # The thread runs in a copy of this method's context, as ``asyncio.to_thread``
        # would: Dask marks the worker running an actor's method in a context variable,
        # so in the trial ``distributed.get_worker()``, ``get_client()``,
        # ``worker_client()`` and ``dask.compute`` reach this worker's cluster. The
        # thread is not one of the worker's task threads: tasks the trial waits on never
        # wait for the thread it holds (``worker_client`` has nothing to secede).
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run, worker.address), daemon=True,
            name=f"dasktune-trial-{self.spec.trial_id}-{self.spec.attempt}",
        )
        self._thread.start()
        self._last_poll = time.monotonic()
        self._watchdog = asyncio.ensure_future(self._orphan_watchdog(self._thread))
        self._where = {"pid": os.getpid(), "host": socket.gethostname(),
                       "worker": worker.address}
        return dict(self._where)

    async def enqueue(self, spec: TrialSpec, after: str | None = None) -> bool:
        """Queue ``spec`` to start as soon as ``after`` (an attempt named as in
        :meth:`poll`: the running one, or the last one queued) ends (see the module
        docs). False, and nothing queued, if the driver already knows the running one
        ended or ``after`` is not the last in line: the driver then starts ``spec`` the
        usual way."""
        with self._cond:  # the trial's thread takes from _next when its attempt ends
            last = self._key if not self._next else attempt_key(self._next[-1])
            if self._end_reported or self._thread is None or \
                    (after is not None and after != last):
                return False
            self._next.append(spec)
        return True

    async def unqueue(self, trial_id: str) -> bool:
        """Drop the queued attempt of ``trial_id``; False if it has started (or was
        never queued here)."""
        with self._cond:
            for spec in self._next:
                if spec.trial_id == trial_id:
                    self._next.remove(spec)
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
        by :class:`~dasktune.execution.recovery.FencePlugin` and by the orphan watchdog."""
        with self._cond:
            self._next.clear()  # this actor is being dropped: start nothing more on it
            self._attempt.fence(reason)

    @property
    def fenced_reason(self) -> str | None:
        """Why the running attempt was fenced, or None."""
        return self._attempt.fenced_reason

    async def poll(self, ack: int, wait: float = 0.2, attempt: str | None = None,
                   limit: int | None = None, gap: float = 0.0) -> dict[str, Any]:
        """Drop reports up to ``ack``; return the next ones (waiting up to ``wait`` s),
        at most ``limit`` of them (0: none, a keep-alive that still reports the end
        once nothing is left to send), and no sooner than ``gap`` s after the last
        reply that carried reports (unless the attempt ends): a trial reporting faster
        than that sends its reports in batches, so the driver's cost per report falls
        as the rate rises.

        ``attempt`` (``"<trial_id>:<attempt>"``) names the attempt polled: a poll of the
        attempt that ended before the running one gets that attempt's last reports,
        and a late poll of an older one gets nothing (its ``ack`` must not drop the new
        attempt's reports).
        """
        assert self._wakeup is not None
        self._last_poll = time.monotonic()
        with self._cond:
            if not self._is(attempt):
                return self._poll_ended(attempt, ack, limit)
            self._acked = max(self._acked, ack)
            _drop_acked(self._buffer, ack)
            self._cond.notify_all()
            gangs = self._attempt.gangs
            empty = not self._buffer and not self._finished and \
                not (gangs is not None and gangs.has_notes())
            if empty:
                self._wakeup.clear()
                self._wake_pending = False
        woke = False
        if empty and wait > 0:
            try:
                await asyncio.wait_for(self._wakeup.wait(), wait)
                woke = True
            except asyncio.TimeoutError:
                pass
        if (woke or not empty) and limit != 0 and self._is(attempt) and \
                not self.spec.sync_reports and not self._finished and \
                not (gangs is not None and gangs.has_notes()):
            # Linger so a fast trial's reports travel in batches -- a moment after a
            # wake-up, and until ``gap`` after the last reply -- but not past its end (its
            # slot waits for this reply) and never with a gang request waiting.
            assert self._ended is not None
            linger = max(_LINGER if woke else 0.0, self._replied + gap - time.monotonic())
            if linger > 0:
                try:
                    await asyncio.wait_for(self._ended.wait(), linger)
                except asyncio.TimeoutError:
                    pass
        with self._cond:
            if not self._is(attempt):  # it ended and its thread took the queued attempt
                return self._poll_ended(attempt, ack, limit)
            batch = _batch(self._buffer, limit)
            finished = self._finished and len(batch) == len(self._buffer)
            reply = {"reports": batch, "finished": finished,
                     "error": self._error if finished else None,
                     # A fenced attempt's end is no trial's end: the driver lost it.
                     "fenced": self.fenced_reason if finished else None,
                     # Gang requests and releases for the driver (dasktune.gang_desk).
                     "gangs": gangs.take_notes() if gangs is not None else []}
        if batch:
            self._replied = time.monotonic()
        if finished:
            # The reply carries the attempt's last reports (they need no ack): from here
            # the actor may take an attempt queued after the thread ended.
            self._end_reported = True
            if self._next:
                with self._cond:
                    spec = self._next.popleft()
                if self._thread is not None:
                    self._thread.join(1.0)  # it is past _finished: only its wake-up is left
                stale = self._reset_now(spec)
                if stale is not None:
                    asyncio.ensure_future(asyncio.to_thread(stale.stop))
                reply["next"] = self._launch()
        return reply

    def _poll_ended(self, attempt: str | None, ack: int,
                    limit: int | None) -> dict[str, Any]:
        """A poll of an attempt that is no longer the running one (under ``_cond``)."""
        prev = self._ended_attempts.get(attempt) if attempt is not None else None
        if prev is None:
            # Not one this actor holds: a late poll after the driver heard the end (it
            # wants nothing), or a driver whose bookkeeping lost track (it must not spin).
            return {"reports": [], "finished": False, "error": None, "gone": True}
        _drop_acked(prev.buffer, ack)
        batch = _batch(prev.buffer, limit)
        if len(batch) < len(prev.buffer):
            return {"reports": batch, "finished": False, "error": None}
        # Its end and its last reports go with the news that the queued attempt runs.
        del self._ended_attempts[attempt]
        return {"reports": batch, "finished": True, "error": prev.error,
                "next": dict(self._where)}

    async def reset(self, spec: TrialSpec) -> None:
        """Take a new attempt (of any trial) once the previous one has ended."""
        stale = self._reset_now(spec)
        if stale is not None:
            await asyncio.to_thread(stale.stop)

    def _reset_now(self, spec: TrialSpec) -> Any:
        """Take ``spec`` once the previous attempt's thread has ended (see :meth:`_take`)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the previous trial of this actor is still running")
        return self._take(spec)

    def _take(self, spec: TrialSpec) -> Any:
        """Make ``spec`` the current attempt (the line behind it and the ended attempts
        not yet polled stay); returns a kept instance the new attempt cannot reuse, for
        the caller to stop (off the event loop), or None."""
        kept, self._kept = self._kept, None
        self._new_attempt(spec)
        if kept is not None and spec.reuse_instance and type(kept) is spec.trainable:
            self._kept = kept  # offered to the new trial through reset_config
            return None
        return kept

    async def close(self) -> None:
        """The actor is being dropped: clean up an instance kept for reuse."""
        kept, self._kept = self._kept, None
        if kept is not None:
            await asyncio.to_thread(kept.stop)

    async def stop(self, checkpoint: bool = False, attempt: str | None = None) -> None:
        """End the attempt: at once, or after its next checkpoint (``checkpoint=True``).

        A class trainable saves one at its next step boundary; a function trainable
        runs on until it reports its next checkpoint. With ``attempt`` (as in
        :meth:`poll`), only that attempt: one that has ended already has nothing to
        stop, and the attempt its thread took over must not be stopped for it.
        """
        if self._is(attempt):
            self._attempt.request_stop(after_checkpoint=checkpoint)

    async def checkpoint(self, attempt: str | None = None) -> None:
        """Save a checkpoint after the step in flight and go on (a class trainable; a
        Callback set ``SHOULD_CHECKPOINT`` in a result the driver saw)."""
        if self._is(attempt):
            self._attempt.checkpoint_now.set()

    async def grant(self, request_id: str, gang: Any, attempt: str | None = None) -> bool:
        """The driver granted the gang request ``request_id``: False if the attempt or
        the request is gone (the executor then takes the slots back)."""
        gangs = self._attempt.gangs
        return self._is(attempt) and gangs is not None and gangs.grant(request_id, gang)

    async def refuse_gang(self, request_id: str, why: str, attempt: str | None = None) -> None:
        """The gang request can never be met: the trial's ``reserve_workers`` raises."""
        if self._is(attempt) and self._attempt.gangs is not None:
            self._attempt.gangs.refuse(request_id, why)

    async def gang_news(self, what: str, gang_id: str, workers: list[str],
                        attempt: str | None = None) -> None:
        """Workers of the attempt's gang ``gang_id`` left the cluster (``what`` is
        ``"lost"``) or are retiring (``"retiring"``): see
        :meth:`dasktune.gang_desk.GangDesk.mark`."""
        if self._is(attempt) and self._attempt.gangs is not None:
            self._attempt.gangs.mark(what, gang_id, workers)

    async def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def evacuated(self) -> bool:
        """Whether the worker may close: the attempt ended (or never started) and the
        driver acknowledged its every report, or no driver polls it any more (read by
        the worker's evacuate plugin)."""
        if self._thread is None or time.monotonic() - self._last_poll > _DRIVER_GONE_S:
            return True
        with self._cond:
            return not self._thread.is_alive() and not self._buffer and \
                not self._ended_attempts

    # ------------------------------------------------------------ runner thread
    def _emit(self, result: dict[str, Any] | None, checkpoint_path: str | None) -> None:
        flags = self._attempt
        with self._cond:
            while len(self._buffer) >= self.spec.max_buffered and not flags.stop_now.is_set():
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
                while self._acked < seq and not flags.stop_now.is_set() and \
                        not flags.stop_after_checkpoint.is_set():
                    self._cond.wait(1.0)

    def _wake(self, ended: bool = False, reopen: bool = False) -> None:
        """Wake the poll (from the trial's thread); ``ended``: an attempt ended, and
        ``reopen``: the next one already runs, so a later poll of it lingers again."""
        if self._loop is not None and self._wakeup is not None:
            try:
                self._loop.call_soon_threadsafe(self._wakeup.set)
                if ended and self._ended is not None:
                    # In order on the loop: the waiting poll is woken before the clear.
                    self._loop.call_soon_threadsafe(self._ended.set)
                    if reopen:
                        self._loop.call_soon_threadsafe(self._ended.clear)
            except RuntimeError:  # the worker's loop closed: the worker is going away
                pass

    def _run(self, worker_address: str) -> None:
        """The thread: run the attempt, then each attempt queued behind it in turn."""
        while True:
            self._run_attempt(worker_address)
            stale, handed_over = self._hand_over()
            if stale is not None:
                try:
                    stale.stop()
                except Exception:  # noqa: BLE001 - a kept instance's cleanup; the next trial runs
                    traceback.print_exc()
            self._wake(ended=True, reopen=handed_over)
            if not handed_over:
                return

    def _hand_over(self) -> tuple[Any, bool]:
        """End the attempt; if one is queued behind it, make it the running one.

        Starting the successor in this thread, the moment its predecessor returns,
        skips a wake-up of the worker's event loop, a poll and a thread start: most of
        the handoff of a short trial. The ended attempt's unsent reports move aside
        (``_ended_attempts``) for the driver's next poll of it, which learns the successor's
        start with them. Returns a kept instance the successor cannot reuse (to stop
        here) and whether there is a successor.
        """
        with self._cond:
            self._finished = True
            if not self._next or self._attempt.fenced.is_set():
                return None, False
            self._ended_attempts[self._key] = _Ended(self._buffer, self._error)
            return self._take(self._next.popleft()), True

    def _run_attempt(self, worker_address: str) -> None:
        if isolation.wants_process(self.spec):  # GPUs: a process that sees only its devices
            try:
                isolation.run_in_process(self._attempt, worker_address, self._cluster)
            except BaseException:  # noqa: BLE001 - the trial's error, reported to the driver
                self._error = traceback.format_exc()
            return
        kept, self._kept = self._kept, None
        self._error, self._kept = self._attempt.run(worker_address, kept)


class _Ended:
    """An attempt whose thread went on to the next one: what its driver has yet to get."""

    __slots__ = ("buffer", "error")

    def __init__(self, buffer: deque[tuple[int, dict[str, Any] | None, str | None]],
                 error: str | None):
        self.buffer, self.error = buffer, error


def attempt_key(spec: TrialSpec) -> str:
    """How the actor's methods name an attempt (``"<trial_id>:<attempt>"``)."""
    return f"{spec.trial_id}:{spec.attempt}"


def _drop_acked(buffer: deque[tuple[int, Any, Any]], ack: int) -> None:
    """Drop the reports the driver acknowledged (sequence numbers up to ``ack``)."""
    while buffer and buffer[0][0] <= ack:
        buffer.popleft()


def _batch(buffer: deque[Any], limit: int | None) -> list[Any]:
    """The first reports of ``buffer``, at most ``limit`` (and _MAX_BATCH) of them."""
    n = _MAX_BATCH if limit is None else min(limit, _MAX_BATCH)
    return [item for _, item in zip(range(n), buffer)]
