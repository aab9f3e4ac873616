"""Adding workers to the scheduler's ``adaptive_target``: the one way dasktune's scheduler
plugins ask Dask's ``Adaptive`` for more.

``Adaptive`` (``cluster.adapt()``) asks the scheduler how many workers it wants through
its ``adaptive_target`` handler; dasktune's own local pool asks the same handler. Each
plugin that wants more workers than Dask's tasks show (a walltime replacement, a gang
that waits: :mod:`dasktune.cluster.walltime`, :mod:`dasktune.execution.gang_demand`)
wraps the handler *as it is now*, so the additions of every plugin count together,
whatever the order they were installed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["HANDLER", "add_to_adaptive_target", "adaptive_target"]

#: The scheduler's handler name (Dask's ``Adaptive.target`` calls it over the comm).
HANDLER = "adaptive_target"


def add_to_adaptive_target(scheduler: Any, extra: Callable[[], int]) -> None:
    """From now on, ``scheduler``'s ``adaptive_target`` answers ``extra()`` workers more
    than it did (chained on the current handler, not on the scheduler's method)."""
    base = scheduler.handlers[HANDLER]

    def target(target_duration: float | None = None) -> int:
        return int(base(target_duration=target_duration)) + max(0, int(extra()))

    scheduler.handlers[HANDLER] = target


def adaptive_target(scheduler: Any, target_duration: float | None = None) -> int:
    """What ``Adaptive`` is told: the scheduler's target with every plugin's addition
    (for a pool that runs on the scheduler's loop and calls no comm)."""
    return int(scheduler.handlers[HANDLER](target_duration=target_duration))
