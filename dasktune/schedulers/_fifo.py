"""First in, first out: every trial runs to the end."""

from __future__ import annotations

from dasktune.schedulers._base import TrialScheduler

__all__ = ["FIFOScheduler"]


class FIFOScheduler(TrialScheduler):
    """Runs trials in the order they are added and never stops one early (Ray's default)."""

    def __init__(self) -> None:
        super().__init__()
