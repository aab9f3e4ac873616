"""``SearchGenerator``: a :class:`Searcher` driven as a :class:`SearchAlgorithm` (Ray's).

It asks the searcher for one config per new trial id, stops after ``num_samples`` (never,
for -1) or when the searcher says FINISHED, and lays each suggestion over the param space so
its constants reach the trial. Searchers do not expand grid_search; a grid in the param space
is an error here, as it is in Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._base import (
    SearchAlgorithm,
    Searcher,
    Suggestion,
    check_num_samples,
)

__all__ = ["SearchGenerator"]

logger = logging.getLogger(__name__)

_BOTH_SPACES = (
    "You passed a `param_space` with search parameters (at {paths}) to the Tuner, but the "
    "searcher {name} was already instantiated with a search space. Make sure `param_space` "
    "holds no more parameter definitions: include them in the searcher's search space instead."
)


class SearchGenerator(SearchAlgorithm):
    """Wraps ``searcher`` for the driver loop.

    Args:
        searcher: any :class:`Searcher` (OptunaSearch, ConcurrencyLimiter, Repeater, ...).
        num_samples: trials to make; -1 for unbounded; None to take the ``num_samples``
            keyword of :meth:`set_search_properties` (default 1).
        experiment_uid: the 8-hex trial-id prefix (default: random).
    """

    def __init__(
        self,
        searcher: Searcher,
        num_samples: int | None = None,
        *,
        experiment_uid: str | None = None,
    ) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"SearchGenerator needs a dasktune.search.Searcher, got {type(searcher).__name__}"
            )
        super().__init__(experiment_uid=experiment_uid)
        self.searcher = searcher
        self._explicit_samples = num_samples is not None
        self._num_samples = check_num_samples(num_samples, "SearchGenerator") if (
            num_samples is not None
        ) else 1
        self._param_space: dict[str, Any] = {}

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        """Pass metric, mode and the param space to the searcher.

        Raises ValueError, like Ray, when the searcher already has its own space and
        ``config`` defines parameters too, when ``config`` holds a grid_search, and when
        ``metric``/``mode`` contradict the searcher's own.
        """
        super().set_search_properties(metric, mode, config, **spec)
        config = {} if config is None else config
        sp.validate_param_space(config)
        if not self._explicit_samples and "num_samples" in spec:
            self._num_samples = check_num_samples(spec["num_samples"], "SearchGenerator")
        for name, given, own in (
            ("metric", metric, self.searcher.metric),
            ("mode", mode, self.searcher.mode),
        ):
            if given is not None and own is not None and given != own:
                raise ValueError(
                    f"TuneConfig {name}={given!r} contradicts the searcher's own "
                    f"{name}={own!r} ({type(self.searcher).__name__}); set it in one place"
                )
        accepted = self.searcher.set_search_properties(metric, mode, dict(config), **spec)
        unresolved = [
            sp.path_str(p)
            for p, v in sp.leaves(config)
            if isinstance(v, sp.Domain) or sp.is_grid(v)
        ]
        if not accepted and unresolved:
            raise ValueError(
                _BOTH_SPACES.format(
                    paths=", ".join(f"'{p}'" for p in unresolved),
                    name=type(self.searcher).__name__,
                )
            )
        grids = [sp.path_str(p) for p, v in sp.leaves(config) if sp.is_grid(v)]
        if grids:
            raise ValueError(
                f"grid_search at {', '.join(repr(g) for g in grids)} can't be used with the "
                f"searcher {type(self.searcher).__name__}: searchers don't expand grids. Use "
                "tune.choice(...), or the default BasicVariantGenerator for a grid"
            )
        self._param_space = dict(config)
        return True

    @property
    def total_samples(self) -> int | None:
        return self._num_samples

    def next_trial(self) -> Suggestion | None:
        """Ask the searcher; None when it has nothing now or the search is finished."""
        if self._finished:
            return None
        if self._num_samples is not None and self._counter >= self._num_samples:
            self._finished = True
            return None
        trial_id = self._trial_id()
        suggested = self.searcher.suggest(trial_id)
        if suggested == Searcher.FINISHED:
            self._finished = True
            return None
        if suggested is None:
            return None
        if not isinstance(suggested, Mapping):
            raise TypeError(
                f"{type(self.searcher).__name__}.suggest() must return a dict, None or "
                f"Searcher.FINISHED, got {type(suggested).__name__}"
            )
        config = _merge(sp.copy_containers(self._param_space), dict(suggested))
        left = [sp.path_str(p) for p, v in sp.leaves(config) if isinstance(v, sp.Domain)]
        if left:
            raise ValueError(
                f"{type(self.searcher).__name__} suggested no value for "
                f"{', '.join(repr(x) for x in left)} of the param_space"
            )
        # tag what was searched, not the param_space's constants (Ray tags everything)
        constants = {p for p, v in sp.leaves(self._param_space) if not isinstance(v, sp.Domain)}
        tag_vars = {p: v for p, v in sp.leaves(suggested) if p not in constants}
        tag = str(self._counter) + (f"_{sp.format_vars(tag_vars)}" if tag_vars else "")
        self._counter += 1
        return Suggestion(trial_id=trial_id, config=config, experiment_tag=tag)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def get_state(self) -> dict:
        state = super().get_state()
        state["num_samples"] = self._num_samples
        try:
            state["searcher"] = self.searcher.get_state()
        except NotImplementedError:
            logger.warning(
                "%s has no get_state(); a restored experiment restarts its search",
                type(self.searcher).__name__,
            )
            state["searcher"] = None
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._num_samples = state["num_samples"]
        if state.get("searcher") is not None:
            self.searcher.set_state(state["searcher"])


def _merge(base: dict, update: Mapping) -> dict:
    """Ray's ``merge_dicts``: ``update`` laid over ``base``, dicts merged key by key."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base
