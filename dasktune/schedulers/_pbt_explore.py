"""PBT's explore step: perturb or resample a config within ``hyperparam_mutations``."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["explore", "validate_mutations"]


def _is_domain(spec: Any) -> bool:
    # dasktune.space.Domain, duck-typed so this module does not import the space package.
    return callable(getattr(spec, "sample", None))


def validate_mutations(mutations: Mapping[str, Any], prefix: str = "") -> None:
    """Raise TypeError/ValueError for a mutation spec PBT cannot use, naming the key."""
    for key, spec in mutations.items():
        path = f"{prefix}{key}"
        if isinstance(spec, Mapping):
            if not spec:
                raise ValueError(f"hyperparam_mutations[{path!r}] is an empty dict")
            validate_mutations(spec, prefix=f"{path}/")
        elif isinstance(spec, (list, tuple)):
            if not spec:
                raise ValueError(f"hyperparam_mutations[{path!r}] is an empty list")
        elif not (_is_domain(spec) or callable(spec)):
            raise TypeError(
                f"hyperparam_mutations[{path!r}] must be a list, a dict, a search space domain "
                f"(tune.uniform, ...) or a callable, got {type(spec).__name__}")


def missing_keys(config: Mapping[str, Any], mutations: Mapping[str, Any],
                 prefix: str = "") -> list[str]:
    """Mutation keys (``a/b`` for nested ones) absent from ``config``."""
    out = []
    for key, spec in mutations.items():
        path = f"{prefix}{key}"
        if not isinstance(config, Mapping) or key not in config:
            out.append(path)
        elif isinstance(spec, Mapping):
            out.extend(missing_keys(config[key], spec, prefix=f"{path}/"))
    return out


def _resample(spec: Any, rng: random.Random) -> Any:
    if _is_domain(spec):
        return spec.sample(rng.randrange(2**32))
    return spec()


def explore(
    config: Mapping[str, Any],
    mutations: Mapping[str, Any],
    resample_probability: float,
    perturbation_factors: Sequence[float],
    custom_explore_fn: Callable[[dict], dict] | None,
    rng: random.Random,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(new_config, operations)``; ``operations`` says what was done to each key.

    Lists: resample with ``resample_probability`` (or when the value is not in the list), else
    move to a neighbouring entry. Domains/callables: resample with ``resample_probability``,
    else multiply by one of ``perturbation_factors`` (ints stay ints). Dicts recurse.
    """
    new = copy.deepcopy(dict(config))
    ops: dict[str, Any] = {}
    for key, spec in mutations.items():
        old = config[key]
        if isinstance(spec, Mapping):
            new[key], ops[key] = explore(old, spec, resample_probability, perturbation_factors,
                                         None, rng)
        elif isinstance(spec, (list, tuple)):
            values = list(spec)
            if rng.random() < resample_probability or old not in values:
                new[key] = rng.choice(values)
                ops[key] = "resample"
            else:
                shift = rng.choice([-1, 1])
                i = values.index(old)
                j = min(max(i + shift, 0), len(values) - 1)
                new[key] = values[j]
                ops[key] = f"shift {'left' if shift < 0 else 'right'}{' (noop)' if i == j else ''}"
        elif rng.random() < resample_probability:
            new[key] = _resample(spec, rng)
            ops[key] = "resample"
        else:
            factor = rng.choice(list(perturbation_factors))
            new[key] = old * factor
            if isinstance(old, int) and not isinstance(old, bool):
                new[key] = int(new[key])
            ops[key] = f"* {factor}"
    if custom_explore_fn is not None:
        out = custom_explore_fn(new)
        if not isinstance(out, dict):
            raise TypeError(f"custom_explore_fn must return the new config dict, got {out!r}")
        new = out
    return new, ops
