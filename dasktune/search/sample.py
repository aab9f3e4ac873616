"""Ray's ``ray.tune.search.sample`` import path for the search-space domains.

The code lives in :mod:`dasktune.space`; this module only re-exports it so that
``from ray.tune.search.sample import Float`` ports as ``from dasktune.search.sample import Float``.
"""

from __future__ import annotations

from dasktune.space import (
    Categorical,
    Domain,
    Float,
    Function,
    Integer,
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)

__all__ = [
    "Categorical",
    "Domain",
    "Float",
    "Function",
    "Integer",
    "choice",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
]
