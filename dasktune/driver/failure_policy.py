"""The failure policy: which failures a trial survives, and its ``error.txt``.

A user error (the trial's code raised, or its actor could not start) counts against
``FailureConfig.max_failures``; a lost worker against ``max_worker_losses`` (a graceful
move off a retiring worker costs nothing). Each failure is appended to the trial's
``error.txt``; a storage outage keeps the text for a later try (every few seconds, and
at the end), never drops it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from dasktune.logger import EXPR_ERROR_FILE

if TYPE_CHECKING:
    from dasktune.config import FailureConfig
    from dasktune.storage import ExperimentStorage
    from dasktune.trial import Trial

__all__ = ["FailurePolicy"]

logger = logging.getLogger(__name__)

_ERROR_RETRY_S = 5.0  # error.txt writes that failed are retried this often


class FailurePolicy:
    """Counts a trial's failures against ``config`` and writes its ``error.txt``."""

    def __init__(self, config: FailureConfig, storage: ExperimentStorage):
        self.config = config
        self.storage = storage
        self._unwritten: list[tuple[Trial, str]] = []
        self._tried = float("-inf")  # a retry is due at once, however young the clock

    @property
    def fail_fast(self) -> bool | str:
        return self.config.fail_fast

    def retries_user_error(self, trial: Trial, error: str) -> bool:
        """Count a failure of ``trial``'s code (and log it); whether to run it again."""
        trial.num_failures += 1
        self.write_error(trial, error)
        limit = self.config.max_failures
        return not trial.is_finished and (limit == -1 or trial.num_failures <= limit) \
            and not self.config.fail_fast

    def worker_loss_error(self, trial: Trial, moved: bool, why: str) -> str | None:
        """Count a lost worker of ``trial`` (not if it was being ``moved``); the error
        that ends the trial if that was one loss too many, else None."""
        if not moved:  # a trial being moved off a leaving worker lost nothing
            trial.num_restarts += 1
        limit = self.config.max_worker_losses
        if limit != -1 and trial.num_restarts > limit:
            return (f"trial {trial.trial_id} lost its worker {trial.num_restarts} times "
                    f"(FailureConfig.max_worker_losses={limit}); last: {why}")
        return None

    # ------------------------------------------------------------- error.txt
    def write_error(self, trial: Trial, error: str) -> None:
        if not trial.path:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._unwritten.append(
            (trial, f"Failure # {trial.num_failures} (occurred at {stamp})\n{error}\n"))
        self.flush()

    def flush_due(self, now: float) -> None:
        """Retry the writes a storage outage held back, if it is time."""
        if self._unwritten and now - self._tried >= _ERROR_RETRY_S:
            self.flush()

    def flush(self) -> None:
        """Append the failures not yet in their ``error.txt``."""
        self._tried = time.monotonic()
        while self._unwritten:
            trial, block = self._unwritten[0]
            path = f"{trial.path}/{EXPR_ERROR_FILE}"
            try:
                old = self.storage.read_bytes(path).decode() if self.storage.exists(path) \
                    else ""
                self.storage.write_bytes(path, (old + block).encode())
            except Exception as exc:  # noqa: BLE001 - never let error reporting hide the error
                logger.warning("could not write %s (%s); retrying later", path, exc)
                return
            trial.error_file = path
            self._unwritten.pop(0)
