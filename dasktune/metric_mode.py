"""Metric and mode: the one validator, and the one rule for taking them from ``TuneConfig``.

Searchers, schedulers, ``TuneConfig``, ``ResultGrid``, the progress reporters and the
dashboard's messages all check a mode here. :func:`merge_search_properties` is what
``set_search_properties`` of both searchers and schedulers applies. Pure functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODES", "check_metric_mode", "check_mode", "merge_search_properties"]

MODES = ("min", "max")


def check_mode(mode: Any, where: str, *, allow_none: bool = True, allow_list: bool = False,
               name: str = "mode") -> None:
    """Raise ValueError unless ``mode`` is ``"min"`` or ``"max"`` (or None where
    ``allow_none``, or a list of them where ``allow_list``); the message starts with
    ``where`` and calls the value ``name``."""
    if mode is None and allow_none:
        return
    for m in mode if allow_list and isinstance(mode, (list, tuple)) else [mode]:
        if m not in MODES:
            raise ValueError(f"{where}: {name} must be 'min' or 'max', got {m!r}")


def check_metric_mode(metric: Any, mode: Any, where: str) -> None:
    """Raise ValueError unless metric/mode are None, a str and "min"/"max", or lists of
    the same length (multi-objective)."""
    check_mode(mode, where, allow_list=True)
    if metric is None or mode is None:
        return
    if isinstance(metric, (list, tuple)) != isinstance(mode, (list, tuple)) or (
        isinstance(mode, (list, tuple)) and len(metric) != len(mode)
    ):
        raise ValueError(
            f"{where}: metric and mode must both be strings, or lists of the same length, got "
            f"metric={metric!r} mode={mode!r}"
        )


def merge_search_properties(own: tuple[Any, Any], given: tuple[Any, Any], *,
                            refuse_twice: bool) -> tuple[Any, Any] | None:
    """The ``(metric, mode)`` an object holds after ``set_search_properties(*given)``, or
    None when it must refuse (``set_search_properties`` then returns False).

    ``own`` is what it was built with, ``given`` what ``TuneConfig`` says (checked by
    the caller: a scheduler takes one metric, a searcher lists too); a None on
    either side leaves the other. Schedulers pass ``refuse_twice=True``: as in Ray, a
    metric (or a mode) given both to the scheduler and to ``TuneConfig`` is refused even
    when the two agree. Searchers refuse only a disagreement (Ray's own example sets the
    same metric on ``OptunaSearch`` and in ``TuneConfig``).
    """
    merged = []
    for mine, theirs in zip(own, given):
        if mine is not None and theirs is not None and (refuse_twice or mine != theirs):
            return None
        merged.append(mine if theirs is None else theirs)
    return merged[0], merged[1]
