"""When to save the experiment state: often enough to resume, rarely enough to be cheap.

The state grows with the trial count (with 10k trials a save takes tens of
milliseconds), so saves are paced: at most every ``controller.checkpoint-period``, and
no more than about 5% of the time counting the write on the storage's io thread (as
Ray's "auto" checkpoint period does). A save that fails on a storage outage is logged
and tried again at the next period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from dasktune import _dask_config
from dasktune.transfer import StorageError

__all__ = ["StateSaves"]

logger = logging.getLogger(__name__)

_MIN_SAVE_GAP = 0.5
_SAVE_SHARE = 19.0  # gap between state saves, in multiples of the last save's duration
_MAX_SAVE_GAP = 30.0

#: ``save(wait)`` writes the state: returns the future of the write on the io thread
#: (its result: the write's duration), or None when written already.
SaveFn = Callable[[bool], "Future[float] | None"]


class StateSaves:
    """Paces calls to ``save`` (None: nothing is saved)."""

    def __init__(self, save: SaveFn | None):
        self._save = save
        self.dirty = False  # something changed since the last save
        self._last = float("-inf")  # due at once, however young the clock
        self._period = _dask_config.get_seconds("controller.checkpoint-period")
        self._gap = _MIN_SAVE_GAP
        self._took = 0.0  # the last save's time: building it, then writing it
        self._writing: Future[float] | None = None  # the last save's write, if in flight

    def maybe_save(self, now: float) -> None:
        """Save if something changed and the period is up."""
        if self.dirty and now - self._last >= max(self._period, self._gap):
            self.save()

    def soon(self) -> None:
        """A trial ended: save soon, not per trial (saving the state per completion
        would be quadratic in the trial count)."""
        self.dirty = True
        if time.monotonic() - self._last >= self._gap:
            self.save()

    def save(self, wait: bool = False) -> None:
        """Save now; ``wait``: written before this returns (the last save). Otherwise the
        file is written on the storage's io thread, a pause in which no ended trial's
        slot would get its successor."""
        if self._save is None:
            return
        if not self._written(wait):
            self.dirty = True  # the last one is still being written: next period
            return
        start = self._last = time.monotonic()
        self.dirty = False
        try:
            self._writing = self._save(wait)
        except StorageError as exc:  # storage outage: keep running, retry next period
            logger.warning("could not save the experiment state: %s", exc)
            self.dirty = True
        self._took = time.monotonic() - start
        self._set_gap()

    def _written(self, wait: bool) -> bool:
        """Whether the last state write (on the io thread) is done; its outcome counted."""
        writing = self._writing
        if writing is None:
            return True
        if not writing.done() and not wait:
            return False
        self._writing = None
        try:
            self._took += writing.result()
        except StorageError as exc:
            logger.warning("could not save the experiment state: %s", exc)
            self.dirty = True
        self._set_gap()
        return True

    def _set_gap(self) -> None:
        self._gap = min(_MAX_SAVE_GAP, max(_MIN_SAVE_GAP, _SAVE_SHARE * self._took))
