"""``BayesOptSearch``: bayesian-optimization's GP behind the :class:`Searcher` contract (Ray's).

As in Ray: the first ``random_search_steps`` trials are random draws and their results are
held back until all of them are in (the GP is fitted on the whole set at once); later asks
are ``optimizer.suggest(utility)``. A config suggested again is skipped (None, "not now") with
``skip_duplicate``; one suggested more than ``patience`` times ends the search (FINISHED).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._base import Searcher
from dasktune.search._library import LibrarySearcher, import_library

bayes_opt = import_library("bayes_opt", "bayesopt", "BayesOptSearch")

__all__ = ["BayesOptSearch"]

logger = logging.getLogger(__name__)


class BayesOptSearch(LibrarySearcher):
    """Gaussian-process Bayesian optimization (Ray's
    ``ray.tune.search.bayesopt.BayesOptSearch``). Floats only, uniform between bounds.

    Args:
        space: a dasktune param space of ``tune.uniform`` parameters, or bayesian-
            optimization's own ``{"name": (lower, upper)}``; None: the Tuner's param space.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, in order.
        utility_kwargs: the acquisition function (``kind``, ``kappa``, ``xi``); default UCB
            with kappa 2.576.
        random_state: seeds the optimizer.
        random_search_steps: random trials before the GP is used.
        verbose: bayesian-optimization's verbosity.
        patience: end the search once a config was suggested more than this many times.
        skip_duplicate: skip a config suggested before.
        analysis: results of an earlier experiment (a ``ResultGrid`` or trials) to start from.
        repeat_float_precision: decimals compared when spotting repeated configs.
    """

    _library = "bayesian-optimization"

    def __init__(
        self,
        space: dict | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        utility_kwargs: dict | None = None,
        random_state: int = 42,
        random_search_steps: int = 10,
        verbose: int = 0,
        patience: int = 5,
        skip_duplicate: bool = True,
        analysis: Any = None,
        repeat_float_precision: int = 5,
    ) -> None:
        if not isinstance(patience, int) or patience <= 0:
            raise ValueError(f"BayesOptSearch: patience must be an int > 0, got {patience!r}")
        if isinstance(repeat_float_precision, bool) or not isinstance(
            repeat_float_precision, int
        ) or repeat_float_precision < 0:
            raise ValueError(
                "BayesOptSearch: repeat_float_precision must be an int >= 0, got "
                f"{repeat_float_precision!r}"
            )
        self._utility_kwargs = utility_kwargs or {"kind": "ucb", "kappa": 2.576, "xi": 0.0}
        self._random_state = random_state
        self._random_steps = random_search_steps
        self._verbose = verbose
        self._patience = patience
        self._skip_duplicate = skip_duplicate
        self._analysis = analysis
        self._precision = repeat_float_precision
        self._seen: Counter[tuple] = Counter()
        self._random_asked = 0
        # results of the random trials, held back; None once the GP takes them as they come
        self._buffered: list[tuple[dict, float]] | None = [] if random_search_steps > 0 else None
        super().__init__(space, metric, mode, points_to_evaluate)

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, Mapping) and bool(space) and all(
            isinstance(v, tuple) and len(v) == 2 for v in space.values()
        )

    def _convert(self, space: dict) -> dict:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
        """A dasktune param space as ``{"a/b": (lower, upper)}``; only uniform floats."""
        bounds = {}
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"BayesOptSearch can't take grid_search (at '{name}')")
            if not isinstance(value, sp.Domain):
                continue
            if not isinstance(value, sp.Float) or value.sampler != "uniform" or value.q:
                raise ValueError(
                    f"BayesOptSearch takes only tune.uniform floats; '{name}' is {value!r}"
                )
            bounds[name] = (float(value.lower), float(value.upper))
        return bounds

    def _setup(self) -> Any:
        opt = bayes_opt.BayesianOptimization(
            f=None, pbounds=dict(self._space), random_state=self._random_state,
            verbose=self._verbose, allow_duplicate_points=True,
        )
        self._utility = bayes_opt.UtilityFunction(**self._utility_kwargs)
        self._opt = opt
        if self._analysis is not None:
            self.add_evaluated_trials(self._analysis, self._metric)
            self._analysis = None
        return opt

    def _key(self, params: dict) -> tuple:
        return tuple(sorted((k, round(float(v), self._precision)) for k, v in params.items()))

    def _ask(self, point: dict | None) -> tuple[Any, dict] | str | None:
        gp_ready = self._buffered is None
        if point is None and not gp_ready and self._random_asked >= self._random_steps:
            return None  # the random trials' results are not all in yet
        params = dict(point) if point is not None else self._opt.suggest(self._utility)
        key = self._key(params)
        self._seen[key] += 1
        if self._seen[key] > self._patience:
            logger.warning("BayesOptSearch: a config was suggested more than patience=%d "
                           "times; the search has converged and ends", self._patience)
            return Searcher.FINISHED
        if self._seen[key] > 1 and self._skip_duplicate:
            return None
        if not gp_ready:
            self._random_asked += 1
        return None, params

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        if not math.isfinite(loss):
            return
        if self._buffered is None:
            self._opt.register(params=params, target=-loss)  # bayes_opt maximizes
            return
        self._buffered.append((params, -loss))
        if len(self._buffered) >= self._random_steps:
            for buffered_params, target in self._buffered:
                self._opt.register(params=buffered_params, target=target)
            self._buffered = None

    def _tell_failed(self, handle: Any, params: dict) -> None:
        if self._buffered is not None:
            self._random_asked -= 1  # a failed random trial is replaced by another

    def _observe(self, params: dict, loss: float) -> None:
        self._opt.register(params=params, target=-loss)
