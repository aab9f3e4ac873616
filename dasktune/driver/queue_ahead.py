"""Queue-ahead lines: successors queued on busy actors, so no slot idles between trials.

Each running trial may have a line of queued successors on its actor
(:meth:`~dasktune.execution.Executor.queue_after`), long enough to cover
``controller.queue-ahead`` of work at the trials' recent run time, so that a driver that
pauses that long (a state save, a garbage-collector pass) idles no slot. Only where
asking the searcher early costs nothing (its suggestions ignore results) and the FIFO
scheduler's choice is "the next trial"; the driver decides whether lines are on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from dasktune import _dask_config
from dasktune.trial import PENDING, RUNNING

if TYPE_CHECKING:
    from dasktune.execution import Executor
    from dasktune.session import TrialSpec
    from dasktune.trial import Trial

__all__ = ["QueueLines"]


class QueueLines:
    """The lines of queued trials behind running ones.

    Args:
        executor: queues and takes back the attempts.
        trials: the driver's trials by id.
        busy: whether the driver is winding a trial's attempt down (no line behind it).
        candidate: the next trial to queue (a waiting one that never ran, else a new
            one), or None.
        spec_for: the next attempt of a trial.
        on_queued: told of each trial queued (it no longer waits for a slot).
    """

    def __init__(self, executor: Executor, trials: dict[str, Trial],
                 busy: Callable[[str], bool], candidate: Callable[[], Trial | None],
                 spec_for: Callable[[Trial], TrialSpec], on_queued: Callable[[Trial], None]):
        self.executor = executor
        self._by_id = trials
        self._busy = busy
        self._candidate = candidate
        self._spec_for = spec_for
        self._on_queued = on_queued
        self.queued: dict[str, str] = {}  # queued trial -> the trial it waits behind
        self._behind: dict[str, str] = {}  # trial -> the queued trial right behind it
        self.need_next: set[str] = set()  # last in a line that is still short
        self._unqueuing: set[str] = set()
        self._queue_ahead = _dask_config.get_seconds("controller.queue-ahead")
        self._max_line = max(1, int(_dask_config.get("controller.max-queued-per-slot")))
        self._run_time: float | None = None  # recent trials' run time (moving average)

    def fill(self) -> None:
        """Lengthen every line that is short."""
        for tid in list(self.need_next):
            running = self._by_id.get(tid)
            if running is None or self._busy(tid) or tid in self._behind or \
                    tid in self._unqueuing or \
                    (running.status != RUNNING and tid not in self.queued):
                self.need_next.discard(tid)
                continue
            trial = self._candidate()
            if trial is None:
                return
            if trial.resources != running.resources:
                return  # it waits for a slot that fits it
            if not self.executor.queue_after(tid, self._spec_for(trial)):
                self.need_next.discard(tid)
                continue
            self.need_next.discard(tid)
            self.queued[trial.trial_id] = tid
            self._behind[tid] = trial.trial_id
            self._on_queued(trial)
            self.extend(tid)

    def extend(self, tid: str) -> None:
        """Mark the line of trials queued behind ``tid`` (or behind the trial it waits
        behind) to be lengthened if it is shorter than the recent run time asks for."""
        while tid in self.queued:  # to the running trial at its head
            tid = self.queued[tid]
        want = 1
        if self._run_time:
            want = min(self._max_line, max(1, math.ceil(self._queue_ahead / self._run_time)))
        n = 0
        while tid in self._behind and n < want:
            tid = self._behind[tid]
            n += 1
        if n < want and tid not in self._behind:
            self.need_next.add(tid)

    def note_run_time(self, trial: Trial) -> None:
        """A trial ran to its end: its run time moves the average that sizes lines."""
        p = trial.placements[-1] if trial.placements else None
        if p is None or p.end is None:
            return
        took = max(p.end - p.start, 1e-4)
        self._run_time = took if self._run_time is None else 0.8 * self._run_time + 0.2 * took

    def is_fresh(self, trial: Trial) -> bool:
        """Whether ``trial`` may be queued: PENDING, never run, not queued already."""
        return trial.status == PENDING and not trial.placements and \
            trial.trial_id not in self.queued and not trial.checkpoint and \
            not trial.restore_path

    def successors(self, tid: str) -> Iterator[str]:
        """The trials queued behind ``tid``, in line order."""
        while tid in self._behind:
            tid = self._behind[tid]
            yield tid

    def take_back_one(self, fits: Callable[[Trial], bool]) -> None:
        """A slot is free but the search has nothing new: take back one queued trial, the
        last of a line (it then starts in the free slot instead of behind a running one)."""
        for tid in self.queued:
            if tid in self._unqueuing or tid in self._behind:
                continue
            if not fits(self._by_id[tid]):
                return
            self._unqueuing.add(tid)
            self.executor.unqueue(tid)
            return

    def unqueue_all(self) -> None:
        for tid in self.queued:
            self.executor.unqueue(tid)

    # ------------------------------------------------------------- events
    def on_unqueued(self, tid: str) -> str | None:
        """``tid`` left its line without starting; the trial it waited behind, if any,
        whose line may need lengthening."""
        self._unqueuing.discard(tid)
        self.need_next.discard(tid)
        ahead = self.queued.pop(tid, None)
        after = self._behind.pop(tid, None)
        if ahead is None or self._behind.get(ahead) != tid:
            return None
        if after is not None:  # out of the line: the next one closes the gap
            self._behind[ahead] = after
            self.queued[after] = ahead
        else:
            del self._behind[ahead]
        return ahead

    def on_ended(self, tid: str) -> None:
        """``tid``'s attempt ended (finished, lost or failed to start)."""
        self.need_next.discard(tid)
        self._behind.pop(tid, None)

    def on_started(self, tid: str) -> None:
        """The queued ``tid`` took over its predecessor's actor."""
        self._unqueuing.discard(tid)
        ahead = self.queued.pop(tid)
        self._behind.pop(ahead, None)
