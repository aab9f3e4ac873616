"""Translation of a dasktune param space into Optuna distributions.

Each ``tune.uniform``/``loguniform``/``randint``/``choice``... leaf becomes the Optuna
distribution that draws the same values (log and quantized domains map to ``log=True`` /
``step=q``); Optuna distributions already in the space are kept; constants pass through.
What Optuna cannot draw (``grid_search``, ``sample_from``, ``randn``) is a ValueError
naming the parameter. :class:`~dasktune.search.optuna.OptunaSearch` is its user.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from optuna import distributions as od
from optuna.distributions import BaseDistribution

from dasktune.space import (
    Categorical,
    Domain,
    Float,
    Function,
    Integer,
    Path,
    is_grid,
    leaves,
    path_str,
    validate_param_space,
)

__all__ = ["optuna_plan", "to_distribution", "to_optuna_distributions"]


def to_distribution(domain: Domain, path: Path) -> BaseDistribution:
    """The Optuna distribution of one domain (``path`` names it in errors)."""
    where = f"parameter '{path_str(path)}'"
    if isinstance(domain, Function):
        raise ValueError(  # noqa: TRY004 - an unsupported value, like grid_search
            f"{where}: Optuna can't take sample_from; compute it inside a define-by-run "
            "function passed as OptunaSearch(space=func)"
        )
    if isinstance(domain, Categorical):
        return od.CategoricalDistribution(domain.categories)
    if isinstance(domain, Float):
        if domain.sampler == "normal":
            raise ValueError(f"{where}: Optuna has no normal distribution (randn/qrandn)")
        if domain.sampler == "loguniform":
            if domain.q is not None:
                warnings.warn(
                    f"{where}: Optuna can't quantize a log distribution; q={domain.q} is dropped",
                    UserWarning,
                    stacklevel=3,
                )
            return od.FloatDistribution(domain.lower, domain.upper, log=True)
        return od.FloatDistribution(domain.lower, domain.upper, step=domain.q)
    if isinstance(domain, Integer):
        if domain.q is None:  # upper exclusive, Optuna's high is inclusive
            return od.IntDistribution(
                domain.lower, domain.upper - 1, log=domain.sampler == "loguniform"
            )
        low, high = domain.q_low(), domain.q_high()
        if domain.sampler == "loguniform":
            if domain.q != 1:
                warnings.warn(
                    f"{where}: Optuna can't quantize a log distribution; q={domain.q} is dropped",
                    UserWarning,
                    stacklevel=3,
                )
            return od.IntDistribution(low, high, log=True)
        return od.IntDistribution(low, high, step=domain.q)
    raise ValueError(f"{where}: no Optuna distribution for {domain!r}")


def optuna_plan(
    space: Mapping[str, Any],
) -> tuple[dict[str, BaseDistribution], dict[str, Path], dict[str, Any]]:
    """Translate ``space``: (distributions by name, path by name, constants by name).

    Names are paths joined with ``"/"``. Optuna distributions already in the space are kept.
    """
    validate_param_space(space)
    dists: dict[str, BaseDistribution] = {}
    paths: dict[str, Path] = {}
    constants: dict[str, Any] = {}
    for path, value in leaves(space):
        name = path_str(path)
        if name in paths or name in constants:
            raise ValueError(f"two parameters flatten to the same name '{name}'")
        if is_grid(value):
            raise ValueError(
                f"parameter '{name}': Optuna can't take grid_search; use tune.choice(...) for a "
                "random pick, or optuna.samplers.GridSampler via "
                "OptunaSearch(sampler=GridSampler({...})) for an exhaustive grid"
            )
        if isinstance(value, BaseDistribution):
            dists[name], paths[name] = value, path
        elif isinstance(value, Domain):
            dists[name], paths[name] = to_distribution(value, path), path
        else:
            constants[name] = value
    return dists, paths, constants


def to_optuna_distributions(
    space: Mapping[str, Any],
) -> tuple[dict[str, BaseDistribution], dict[str, Any]]:
    """Translate a param space to Optuna: ``(distributions, constants)``, both keyed by
    ``"/"``-joined paths (``"model/lr"``).

    log and quantized domains map to ``log=True`` / ``step=q``. grid_search, sample_from and
    randn raise ValueError naming the parameter.
    """
    dists, _, constants = optuna_plan(space)
    return dists, constants
