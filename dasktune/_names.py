"""Ray's short names for searchers and schedulers (``create_searcher``/``create_scheduler``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def resolve_short_name(caller: str, what: str, name: Any, known: Collection[str],
                       unavailable: Collection[str]) -> str:
    """``name`` as the lowercase key into ``known``, or a TypeError/ValueError naming it
    (and saying so when it is one of Ray's that dasktune does not provide)."""
    if not isinstance(name, str):
        raise TypeError(f"{caller} needs a {what} name, got {name!r}")
    key = name.lower()
    if key in unavailable:
        raise ValueError(f"the {what} {name!r} is not available in dasktune")
    if key not in known:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(known)}")
    return key
