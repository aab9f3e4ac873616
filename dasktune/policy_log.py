"""PBT's policy log (``log_config``): the lines schedulers decide, written by a callback.

A scheduler never writes: :class:`~dasktune.schedulers.PopulationBasedTraining` puts
Ray's policy line into its :class:`~dasktune.schedulers.Exploit`, the driver hands the
exploit to the callbacks (``on_trial_exploit``), and :class:`PBTPolicyLogger` appends the
line to ``pbt_global.txt`` and to ``pbt_policy_<trial_id>.txt`` in the experiment folder.
The trial's file first takes over the donor's: the trial now continues its history.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dasktune.callback import Callback

if TYPE_CHECKING:
    from dasktune.storage import ExperimentStorage
    from dasktune.trial import Trial

__all__ = ["PBTPolicyLogger"]

logger = logging.getLogger(__name__)


class PBTPolicyLogger(Callback):
    """Writes the policy lines of exploits into the experiment's storage."""

    def __init__(self) -> None:
        self._storage: ExperimentStorage | None = None

    def setup(self, *args: Any, storage: ExperimentStorage | None = None, **info: Any) -> None:
        self._storage = storage

    def on_trial_exploit(self, iteration: int, trials: list[Trial], trial: Trial,
                         exploit: Any, **info: Any) -> None:
        policy = getattr(exploit, "policy", None)
        storage = self._storage
        if policy is None or storage is None:
            return
        line = policy.line.encode()
        try:
            glob_path = storage.path("pbt_global.txt")
            old = storage.read_bytes(glob_path) if storage.exists(glob_path) else b""
            storage.write_bytes(glob_path, old + line)
            theirs = storage.path(f"pbt_policy_{policy.donor_trial_id}.txt")
            history = storage.read_bytes(theirs) if storage.exists(theirs) else b""
            storage.write_bytes(storage.path(f"pbt_policy_{policy.trial_id}.txt"),
                                history + line)
        except Exception:  # noqa: BLE001 - a log that cannot be written must not stop PBT
            logger.warning("could not write the PBT policy log of trial %s",
                           policy.trial_id, exc_info=True)
