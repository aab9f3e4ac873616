"""Search algorithms: what configs to try next.

:class:`Searcher` is Ray's contract for a suggester (``suggest`` / ``on_trial_complete``);
:class:`SearchAlgorithm` is what the driver loop drives (``next_trial`` / ``is_finished``).
:class:`BasicVariantGenerator` is the default grid and random search; any Searcher runs
inside a :class:`SearchGenerator`. The library searchers (Optuna, HyperOpt, Ax, BayesOpt,
BOHB, Nevergrad, HEBO, ZOOpt) live in ``dasktune.search.<name>``, imported only when asked
for, so this package imports none of those libraries.
"""

from __future__ import annotations

import importlib
from typing import Any

from dasktune._names import resolve_short_name
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

# Ray's short names -> (module, class); each library is imported only when asked for.
_LIBRARY_SEARCHERS = {
    "optuna": ("dasktune.search.optuna", "OptunaSearch"),
    "hyperopt": ("dasktune.search.hyperopt", "HyperOptSearch"),
    "ax": ("dasktune.search.ax", "AxSearch"),
    "bayesopt": ("dasktune.search.bayesopt", "BayesOptSearch"),
    "bohb": ("dasktune.search.bohb", "TuneBOHB"),
    "nevergrad": ("dasktune.search.nevergrad", "NevergradSearch"),
    "hebo": ("dasktune.search.hebo", "HEBOSearch"),
    "zoopt": ("dasktune.search.zoopt", "ZOOptSearch"),
}
_SEARCHERS = ("random", "variant_generator", *_LIBRARY_SEARCHERS)


def create_searcher(search_alg: str, **kwargs: Any) -> SearchAlgorithm | Searcher:
    """Build a search algorithm from its Ray short name (Ray's ``create_searcher``).

    ``"random"`` and ``"variant_generator"`` give a :class:`BasicVariantGenerator`;
    ``"optuna"``, ``"hyperopt"``, ``"ax"``, ``"bayesopt"``, ``"bohb"``, ``"nevergrad"``,
    ``"hebo"`` and ``"zoopt"`` the searcher of :mod:`dasktune.search.<name>`; ``kwargs`` go to
    the constructor, e.g. ``create_searcher("optuna", metric="loss", mode="min")``.
    """
    key = resolve_short_name("create_searcher", "search algorithm", search_alg, _SEARCHERS, ())
    if key in _LIBRARY_SEARCHERS:
        module, name = _LIBRARY_SEARCHERS[key]
        return getattr(importlib.import_module(module), name)(**kwargs)
    return BasicVariantGenerator(**kwargs)
