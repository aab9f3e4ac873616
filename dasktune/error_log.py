"""A trial's ``error.txt``: one block per failure, written by a logger callback.

Ray's ``Trial.handle_error`` appends ``Failure # N (occurred at DATE)`` and the error to
``<trial dir>/error.txt`` before any callback hears of the failure. Here
:class:`ErrorFileLogger` does it, and is the first callback of every run (the driver
puts it there), so the driver's callbacks carry the whole story: ``on_trial_recover`` for
a failure that will be retried, ``on_trial_error`` for the one that ends the trial. It
writes only what the trial itself carries -- ``trial.error_msg``, ``trial.num_failures``
and its last placement -- so a user's own :class:`~dasktune.logger.LoggerCallback` sees
the same information in the same hooks, with ``trial.error_file`` set and the file there.

A trial moved off a lost worker has not failed (it counts against ``max_worker_losses``,
not ``max_failures``): its ``on_trial_recover`` writes nothing. Its last loss too many
does, as every error that ends a trial does.

Ray also pickles the exception into ``error.pkl``. dasktune's errors cross from the worker
as traceback text (the user's exception class may not even import on the driver), so
there is no exception object to pickle and no ``error.pkl``; ``Result.error`` carries the
text.

A storage outage keeps the text for a later try (every few seconds, and at the end);
nothing is dropped.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from dasktune.logger import EXPR_ERROR_FILE, LoggerCallback

if TYPE_CHECKING:
    from dasktune.trial import Trial

__all__ = ["ErrorFileLogger"]

logger = logging.getLogger(__name__)

_RETRY_S = 5.0  # writes that failed are retried this often


class ErrorFileLogger(LoggerCallback):
    """Appends each failure of a trial to its ``error.txt`` and sets ``trial.error_file``."""

    def __init__(self) -> None:
        self._unwritten: list[tuple[Trial, str]] = []
        self._tried = float("-inf")  # a retry is due at once, however young the clock

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        if not trial.lost_its_worker:
            self.log_failure(trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        self.log_failure(trial)

    def log_failure(self, trial: Trial) -> None:
        """Append ``trial``'s newest failure (``trial.error_msg``) to its ``error.txt``."""
        if not trial.path:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._unwritten.append(
            (trial, f"Failure # {trial.num_failures} (occurred at {stamp})\n"
                    f"{trial.error_msg or ''}\n"))
        self.write_pending()

    def flush(self) -> None:
        """Retry the writes a storage outage held back, if it is time."""
        if self._unwritten and time.monotonic() - self._tried >= _RETRY_S:
            self.write_pending()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.write_pending()

    def write_pending(self) -> None:
        """Append the failures not yet in their ``error.txt``, oldest first."""
        self._tried = time.monotonic()
        while self._unwritten:
            trial, block = self._unwritten[0]
            path = f"{trial.path}/{EXPR_ERROR_FILE}"
            storage = self.storage
            if storage is None:
                return  # not set up yet: written at the next try
            try:
                old = storage.read_bytes(path).decode() if storage.exists(path) else ""
                storage.write_bytes(path, (old + block).encode())
            except Exception as exc:  # noqa: BLE001 - never let error reporting hide the error
                logger.warning("could not write %s (%s); retrying later", path, exc)
                return
            trial.error_file = path
            self._unwritten.pop(0)
