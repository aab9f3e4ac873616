"""Shared plumbing of searchers that wrap another searcher (ConcurrencyLimiter, Repeater)."""

from __future__ import annotations

from typing import Any

from dasktune.search._base import Searcher

__all__ = ["WrapperSearcher"]


class WrapperSearcher(Searcher):
    """A :class:`Searcher` around ``searcher``: metric, mode and search properties are the
    inner searcher's; subclasses add their own bookkeeping to :meth:`get_state`."""

    def __init__(self, searcher: Searcher) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"{type(self).__name__} wraps a dasktune.search.Searcher, got "
                f"{type(searcher).__name__}"
            )
        self.searcher = searcher
        super().__init__()

    @property
    def metric(self) -> Any:
        return self.searcher.metric

    @property
    def mode(self) -> Any:
        return self.searcher.mode

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def add_evaluated_point(
        self,
        parameters: dict,
        value: float | list[float],
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        self.searcher.add_evaluated_point(parameters, value, error, pruned, intermediate_values)

    def _inner_state(self) -> dict | None:
        try:
            return self.searcher.get_state()
        except NotImplementedError:
            return None

    def _set_inner_state(self, state: dict | None) -> None:
        if state is not None:
            self.searcher.set_state(state)
