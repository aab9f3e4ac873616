"""Search algorithms: what configs to try next.

:class:`Searcher` is Ray's contract for a suggester (``suggest`` / ``on_trial_complete``);
:class:`SearchAlgorithm` is what the driver loop drives (``next_trial`` / ``is_finished``).
:class:`BasicVariantGenerator` is the default grid and random search; any Searcher runs
inside a :class:`SearchGenerator`. Optuna lives in :mod:`dasktune.search.optuna`, imported
only when asked for, so this package does not import optuna.
"""

from __future__ import annotations

from typing import Any

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
    "create_searcher",
]

# Ray's short names that dasktune provides; optuna is imported only when asked for.
_SEARCHERS = ("random", "variant_generator", "optuna")
# Ray's names whose libraries dasktune does not wrap.
_UNAVAILABLE = ("ax", "bayesopt", "bohb", "hebo", "hyperopt", "nevergrad", "zoopt")


def create_searcher(search_alg: str, **kwargs: Any) -> SearchAlgorithm | Searcher:
    """Build a search algorithm from its Ray short name (Ray's ``create_searcher``).

    ``"random"`` and ``"variant_generator"`` give a :class:`BasicVariantGenerator`,
    ``"optuna"`` an :class:`~dasktune.search.optuna.OptunaSearch`; ``kwargs`` go to the
    constructor, e.g. ``create_searcher("optuna", metric="loss", mode="min")``.
    """
    from dasktune._names import resolve_short_name

    key = resolve_short_name("create_searcher", "search algorithm", search_alg, _SEARCHERS,
                             _UNAVAILABLE)
    if key == "optuna":
        from dasktune.search.optuna import OptunaSearch

        return OptunaSearch(**kwargs)
    return BasicVariantGenerator(**kwargs)
