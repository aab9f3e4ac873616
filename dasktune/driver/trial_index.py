"""The trial index: every trial by id and position, and the waiting ones in trial order.

Picking the next PENDING or PAUSED trial, and asking "is any waiting?", cost no scan of
every trial (an experiment may hold 10k+ of them): each waiting status keeps a heap of
(position, trial id), cleaned lazily of trials that have left it since.
"""

from __future__ import annotations

import heapq
from collections.abc import Container
from typing import TYPE_CHECKING

from dasktune.trial import PAUSED, PENDING

if TYPE_CHECKING:
    from dasktune.trial import Trial

__all__ = ["TrialIndex"]


class TrialIndex:
    """The experiment's trials (``trials``, in order; ``by_id``) and their waiting index.

    Change a trial's status only through :meth:`set_status`, so the index follows.
    """

    def __init__(self, trials: list[Trial]):
        self.trials = trials
        self.by_id = {t.trial_id: t for t in trials}
        self._pos = {t.trial_id: i for i, t in enumerate(trials)}
        self._waiting: dict[str, list[tuple[int, str]]] = {PENDING: [], PAUSED: []}
        self._n = {PENDING: 0, PAUSED: 0}
        for trial in trials:
            self._index(trial, None)

    def add(self, trial: Trial) -> None:
        self._pos[trial.trial_id] = len(self.trials)
        self.trials.append(trial)
        self.by_id[trial.trial_id] = trial
        self._index(trial, None)

    def set_status(self, trial: Trial, status: str) -> None:
        old = trial.status
        trial.set_status(status)
        if old != status:
            self._index(trial, old)

    def count(self, status: str) -> int:
        """How many trials are PENDING (or PAUSED)."""
        return self._n[status]

    def first(self, status: str, skip: Container[str] = ()) -> Trial | None:
        """The first trial (in trial order) with ``status`` whose id is not in ``skip``."""
        heap, skipped = self._waiting[status], []
        found = None
        while heap:
            tid = heap[0][1]
            if self.by_id[tid].status != status:
                heapq.heappop(heap)  # left that status since it was indexed
            elif tid in skip:
                skipped.append(heapq.heappop(heap))
            else:
                found = self.by_id[tid]
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return found

    def _index(self, trial: Trial, old: str | None) -> None:
        if old in self._n:
            self._n[old] -= 1  # type: ignore[index]
        if trial.status in self._n:
            self._n[trial.status] += 1
            heapq.heappush(self._waiting[trial.status],
                           (self._pos[trial.trial_id], trial.trial_id))
