"""Trainables registered by name (Ray's ``tune.register_trainable``), for ``Tuner("name")``.

The registry lives in the driver process: ``Tuner`` resolves the name there and ships the
trainable itself to the workers, so nothing needs registering on them.
"""

from __future__ import annotations

import logging
from typing import Any

from dasktune.trainable import validate_trainable

__all__ = ["get_trainable", "register_trainable", "registered_trainables"]

logger = logging.getLogger(__name__)

_TRAINABLES: dict[str, Any] = {}


def register_trainable(name: str, trainable: Any, warn: bool = True) -> None:
    """Register ``trainable`` (a function or :class:`~dasktune.Trainable` subclass) as ``name``.

    Registering a name again replaces the earlier trainable. ``warn`` is accepted for Ray's
    signature; the checks here are the ones ``Tuner`` makes.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_trainable: name must be a non-empty str, got {name!r}")
    validate_trainable(trainable)
    if name in _TRAINABLES and _TRAINABLES[name] is not trainable:
        logger.info("register_trainable: %r now names %r (was %r)", name, trainable,
                    _TRAINABLES[name])
    _TRAINABLES[name] = trainable


def get_trainable(name: str) -> Any:
    """The trainable registered as ``name``; a ``ValueError`` naming the registered ones if none."""
    try:
        return _TRAINABLES[name]
    except KeyError:
        known = ", ".join(repr(n) for n in sorted(_TRAINABLES)) or "none"
        raise ValueError(
            f"no trainable is registered as {name!r} (registered: {known}); call "
            f"tune.register_trainable({name!r}, trainable) first, or pass the function or "
            f"Trainable class itself") from None


def registered_trainables() -> list[str]:
    """The names registered so far, sorted."""
    return sorted(_TRAINABLES)
