"""``HEBOSearch``: Huawei's HEBO behind the :class:`Searcher` contract (Ray's).

HEBO suggests in batches: as in Ray, it is asked for ``max_concurrent`` configs at once, hands
them out one per trial, and asks for the next batch only once every trial of the batch has
completed (it handles concurrency itself, so a ``ConcurrencyLimiter`` around it only sets
``max_concurrent``). Results are ``observe``\\ d one by one. HEBO draws from numpy's and
torch's global generators, so ``random_state_seed`` seeds those (as Ray does).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dasktune import space as sp
from dasktune.search._library import LibrarySearcher, import_library

import_library("hebo", "hebo", "HEBOSearch")
import pandas as pd  # noqa: E402  (HEBO's own dependency)
import torch  # noqa: E402
from hebo.design_space.design_space import DesignSpace  # noqa: E402
from hebo.optimizers.hebo import HEBO  # noqa: E402

__all__ = ["HEBOSearch"]

logger = logging.getLogger(__name__)


class HEBOSearch(LibrarySearcher):
    """Search with HEBO (Ray's ``ray.tune.search.hebo.HEBOSearch``).

    Args:
        space: a dasktune param space or a HEBO ``DesignSpace``; None: the Tuner's
            ``param_space``.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, in order.
        evaluated_rewards: the metric of each of ``points_to_evaluate``, already known:
            those points are observed instead of being run.
        random_state_seed: seeds numpy's and torch's global generators when HEBO is built.
        max_concurrent: the batch size (set by a ``ConcurrencyLimiter`` around it).
        **kwargs: more arguments of ``hebo.optimizers.hebo.HEBO``.
    """

    _library = "HEBO"

    def __init__(
        self,
        space: dict | DesignSpace | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        evaluated_rewards: list | None = None,
        random_state_seed: int | None = None,
        max_concurrent: int = 8,
        **kwargs: Any,
    ) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"HEBOSearch: max_concurrent must be an int >= 1, got {max_concurrent!r}")
        self._seed = random_state_seed
        self._max_concurrent = max_concurrent
        self._hebo_config = kwargs
        self._batch: list[dict] = []  # suggested by HEBO, not yet handed out
        self._batch_filled = False
        super().__init__(space, metric, mode, points_to_evaluate, evaluated_rewards)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._max_concurrent = max_concurrent
        return True

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, DesignSpace)

    def _convert(self, space: dict) -> DesignSpace:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: dict) -> DesignSpace:
        """A dasktune param space as a HEBO ``DesignSpace`` (names: ``"/"``-joined paths)."""
        params = []
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"HEBOSearch can't take grid_search (at '{name}')")
            if not isinstance(value, sp.Domain):
                continue
            if isinstance(value, sp.Categorical):
                params.append({"name": name, "type": "cat", "categories": list(value.categories)})
                continue
            if isinstance(value, sp.Function) or value.sampler == "normal" or value.q:
                raise ValueError(f"HEBOSearch can't take {value!r} (at '{name}')")
            log = value.sampler == "loguniform"
            if isinstance(value, sp.Float):
                kind, upper = ("pow" if log else "num"), value.upper
            else:  # upper is exclusive
                kind, upper = ("pow_int" if log else "int"), value.upper - 1
            params.append({"name": name, "type": kind, "lb": value.lower, "ub": upper})
        return DesignSpace().parse(params)

    def _setup(self) -> Any:
        if self._seed is not None:
            np.random.seed(self._seed)
            torch.manual_seed(self._seed)
        return HEBO(space=self._space, **self._hebo_config)

    def _ask(self, point: dict | None) -> tuple[Any, dict] | None:
        if point is not None:
            return None, dict(point)
        if not self._live:
            self._batch_filled = False
        if self._batch_filled or len(self._live) >= self._max_concurrent:
            return None
        if not self._batch:
            self._batch = self._opt.suggest(n_suggestions=self._max_concurrent).to_dict("records")
        params = self._batch.pop(0)
        if len(self._live) + 1 >= self._max_concurrent:
            self._batch_filled = True
        return None, params

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        self._observe(params, loss)

    def _observe(self, params: dict, loss: float) -> None:
        if np.isfinite(loss):
            self._opt.observe(pd.DataFrame([params]), np.array([[loss]]))
