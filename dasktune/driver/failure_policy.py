"""The failure policy: which failures a trial survives.

A user error (the trial's code raised, or its actor could not start) counts against
``FailureConfig.max_failures``; a lost worker against ``max_worker_losses`` (a graceful
move off a retiring worker costs nothing). The policy decides and writes nothing: each
failure reaches the trial's ``error.txt`` through the callbacks
(:class:`~dasktune.error_log.ErrorFileLogger`), as every other trial file does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dasktune.config import FailureConfig
    from dasktune.trial import Trial

__all__ = ["FailurePolicy"]


class FailurePolicy:
    """Counts a trial's failures against ``config``."""

    def __init__(self, config: FailureConfig):
        self.config = config

    @property
    def fail_fast(self) -> bool | str:
        return self.config.fail_fast

    def retries_user_error(self, trial: Trial) -> bool:
        """Count a failure of ``trial``'s code; whether to run it again."""
        trial.num_failures += 1
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
