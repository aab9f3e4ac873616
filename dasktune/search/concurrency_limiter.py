"""``ConcurrencyLimiter``: at most ``max_concurrent`` suggestions in flight (Ray's)."""

from __future__ import annotations

import logging
from typing import Any

from dasktune.search._base import Searcher
from dasktune.search._wrapper import WrapperSearcher

__all__ = ["ConcurrencyLimiter"]

logger = logging.getLogger(__name__)


class ConcurrencyLimiter(WrapperSearcher):
    """Suggest nothing while ``max_concurrent`` trials are live.

    With ``batch=True`` the inner searcher hears of completed trials only once the whole
    batch of ``max_concurrent`` has completed, and only then are new ones suggested.
    If the inner searcher limits concurrency itself (:meth:`Searcher.set_max_concurrency`
    returns True), this only forwards.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool):
            raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        super().__init__(searcher)
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: set[str] = set()
        self.num_unfinished_live_trials = 0
        self.cached_results: dict[str, tuple[dict | None, bool]] = {}
        # As in Ray: a searcher that limits concurrency itself (HEBO, BOHB) is told the
        # limit now and again with the search properties; this then only forwards.
        self._limit_concurrency = not searcher.set_max_concurrency(max_concurrent)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        self._limit_concurrency = not self.searcher.set_max_concurrency(self.max_concurrent)
        return super().set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict | None | str:
        if not self._limit_concurrency:
            return self.searcher.suggest(trial_id)
        if trial_id in self.live_trials:
            raise ValueError(f"ConcurrencyLimiter: trial id {trial_id!r} was already suggested")
        if len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if suggestion not in (None, Searcher.FINISHED):
            self.live_trials.add(trial_id)
            self.num_unfinished_live_trials += 1
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if not self._limit_concurrency:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            return
        if trial_id not in self.live_trials or trial_id in self.cached_results:
            return
        if not self.batch:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            self.live_trials.remove(trial_id)
            self.num_unfinished_live_trials -= 1
            return
        self.cached_results[trial_id] = (result, error)
        self.num_unfinished_live_trials -= 1
        if self.num_unfinished_live_trials <= 0:  # the whole batch is in: tell the searcher
            for done_id, (done_result, done_error) in self.cached_results.items():
                self.searcher.on_trial_complete(done_id, result=done_result, error=done_error)
                self.live_trials.remove(done_id)
            self.cached_results = {}
            self.num_unfinished_live_trials = 0

    def get_state(self) -> dict:
        return {
            "max_concurrent": self.max_concurrent,
            "batch": self.batch,
            "live_trials": sorted(self.live_trials),
            "num_unfinished_live_trials": self.num_unfinished_live_trials,
            "cached_results": dict(self.cached_results),
            "limit_concurrency": self._limit_concurrency,
            "searcher": self._inner_state(),
        }

    def set_state(self, state: dict) -> None:
        self.max_concurrent = state["max_concurrent"]
        self.batch = state["batch"]
        self.live_trials = set(state["live_trials"])
        self.num_unfinished_live_trials = state["num_unfinished_live_trials"]
        self.cached_results = dict(state["cached_results"])
        self._limit_concurrency = state["limit_concurrency"]
        self._set_inner_state(state["searcher"])
