"""Search algorithms: what configs to try next.

:class:`Searcher` is Ray's contract for a suggester (``suggest`` / ``on_trial_complete``);
:class:`SearchAlgorithm` is what the driver loop drives (``next_trial`` / ``is_finished``).
:class:`BasicVariantGenerator` is the default grid and random search; any Searcher runs
inside a :class:`SearchGenerator`. Optuna lives in :mod:`dasktune.search.optuna`, imported
only when asked for, so this package does not import optuna.
"""

from __future__ import annotations

from dasktune.search._base import SearchAlgorithm, Searcher, Suggestion
from dasktune.search.basic_variant import BasicVariantGenerator
from dasktune.search.concurrency_limiter import ConcurrencyLimiter
from dasktune.search.repeater import TRIAL_INDEX, Repeater
from dasktune.search.search_generator import SearchGenerator

__all__ = [
    "TRIAL_INDEX",
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "Repeater",
    "SearchAlgorithm",
    "SearchGenerator",
    "Searcher",
    "Suggestion",
]
