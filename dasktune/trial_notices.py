"""One console line (or two) per trial that errored, lost its worker or is retried.

The progress table only counts ERROR trials; as Ray's console output does ("Trial X
errored after N iterations ... Error file: ..."), a user also sees why and where to look,
and a lost worker's trials are named as they move. A callback, added by the Tuner at
verbosity 1 and above.
"""

from __future__ import annotations

import sys
import time
from typing import IO, TYPE_CHECKING, Any

from dasktune.callback import Callback
from dasktune.logger import EXPR_ERROR_FILE

if TYPE_CHECKING:
    from dasktune.trial import Trial

__all__ = ["TrialNotices", "last_error_line"]


def last_error_line(error: str | None) -> str:
    """The line of a traceback that says what went wrong (its last non-empty one)."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _error_file(trial: Trial) -> str:
    if trial.error_file:
        return trial.error_file
    return f"{trial.path}/{EXPR_ERROR_FILE}" if trial.path else "(not written)"


class TrialNotices(Callback):
    """Prints a trial's error (its last line and its ``error.txt``) and its restarts."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out

    def _say(self, text: str) -> None:
        out = self._out or sys.stdout
        out.write(text + "\n")
        out.flush()

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        iters = trial.last_result.get("training_iteration", 0)
        spent = ""
        if trial.start_time is not None:
            spent = f" Total running time: {time.time() - trial.start_time:.0f}s."
        self._say(f"Trial {trial} errored after {iters} iterations at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}.{spent}\n"
                  f"  {last_error_line(trial.error_msg)}\n"
                  f"  Error file: {_error_file(trial)}")

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        start = f"checkpoint {trial.checkpoint}" if trial.checkpoint else "scratch"
        if trial.lost_its_worker:
            self._say(f"Trial {trial}: worker {trial.placements[-1].worker} was lost; "
                      f"moving the trial, restarting from {start}")
        else:
            self._say(f"Trial {trial} errored (failure {trial.num_failures}), retrying from "
                      f"{start}: {last_error_line(trial.error_msg)}")
