"""``ZOOptSearch``: ZOOpt's (A)SRacos behind the :class:`Searcher` contract (Ray's).

ZOOpt's Tune interface (``SRacosTune``) asks with ``suggest()`` and learns with
``complete(solution, loss)``. It first hands out its initial samples (``points_to_evaluate``
among them, first) and says "not now" until all of them are complete, then keeps up to
``parallel_num`` trials in flight; it ends the search (FINISHED) when it can't find a config
it has not tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._base import Searcher
from dasktune.search._library import LibrarySearcher, import_library

zoopt = import_library("zoopt", "zoopt", "ZOOptSearch")
from zoopt.algos.opt_algorithms.racos.sracos import SRacosTune  # noqa: E402
from zoopt.solution import Solution  # noqa: E402
from zoopt.utils.zoo_global import gl  # noqa: E402

__all__ = ["ZOOptSearch"]


class ZOOptSearch(LibrarySearcher):
    """Search with ZOOpt (Ray's ``ray.tune.search.zoopt.ZOOptSearch``).

    Args:
        algo: ``"asracos"`` (default) or ``"sracos"`` (both are ZOOpt's SRacos for Tune).
        budget: how many trials ZOOpt plans for (match ``num_samples``); required.
        dim_dict: a dasktune param space, or ZOOpt's own ``{"name": (ValueType.CONTINUOUS,
            [lower, upper], precision)}`` / ``(ValueType.DISCRETE, [lower, upper], True)`` /
            ``(ValueType.GRID, [choices])``; None: the Tuner's ``param_space``.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first (ZOOpt's initial samples).
        parallel_num: trials ZOOpt keeps in flight after its initial samples.
        **kwargs: more arguments of ``zoopt.Parameter``; ``seed`` seeds numpy's global
            generator, which ZOOpt draws from, when the search is set up.
    """

    _library = "ZOOpt"

    def __init__(
        self,
        algo: str = "asracos",
        budget: int | None = None,
        dim_dict: dict | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        parallel_num: int = 1,
        **kwargs: Any,
    ) -> None:
        if str(algo).lower() not in ("asracos", "sracos"):
            raise ValueError(f"ZOOptSearch: algo must be 'asracos' or 'sracos', got {algo!r}")
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"ZOOptSearch needs budget, an int >= 1 (num_samples), got {budget!r}")
        if not isinstance(parallel_num, int) or parallel_num < 1:
            raise ValueError(f"ZOOptSearch: parallel_num must be an int >= 1, got {parallel_num!r}")
        self._algo = str(algo).lower()
        self._budget = budget
        self._parallel_num = parallel_num
        self._kwargs = kwargs
        super().__init__(dim_dict, metric, mode, points_to_evaluate)

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, Mapping) and bool(space) and all(
            isinstance(v, tuple) and v and isinstance(v[0], type(zoopt.ValueType.GRID))
            for v in space.values()
        )

    def _convert(self, space: dict) -> dict:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: Mapping[str, Any]) -> dict[str, tuple]:
        """A dasktune param space as ZOOpt's ``dim_dict`` keyed by ``"/"``-joined paths."""
        dims: dict[str, tuple] = {}
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"ZOOptSearch can't take grid_search (at '{name}')")
            if not isinstance(value, sp.Domain):
                continue
            if isinstance(value, sp.Categorical):
                dims[name] = (zoopt.ValueType.GRID, list(value.categories))
                continue
            if isinstance(value, sp.Function) or value.sampler != "uniform":
                raise ValueError(
                    f"ZOOptSearch takes uniform floats and ints and choices; '{name}' is {value!r}"
                )
            if isinstance(value, sp.Float):
                dims[name] = (zoopt.ValueType.CONTINUOUS, [value.lower, value.upper],
                              value.q or 1e-12)
            elif value.q is not None:
                raise ValueError(f"ZOOptSearch can't quantize an int (at '{name}')")
            else:  # upper is exclusive
                dims[name] = (zoopt.ValueType.DISCRETE, [value.lower, value.upper - 1], True)
        return dims

    def _setup(self) -> Any:
        self._keys = list(self._space)
        init = [Solution(x=[p[k] for k in self._keys])
                for p in (self._flat_point(p) for p in self._points)] or None
        self._points = []  # handed to ZOOpt as its first initial samples
        parameter = zoopt.Parameter(budget=self._budget, init_samples=init, **self._kwargs)
        if parameter.get_seed() is not None:
            # ZOOpt draws from numpy's global generator. Its Opt.min seeds that from
            # Parameter(seed=...); its Tune interface never does, so a seed did nothing.
            gl.set_seed(parameter.get_seed())
        dimension = zoopt.Dimension2([self._space[k] for k in self._keys])
        return SRacosTune(dimension=dimension, parameter=parameter,
                          parallel_num=self._parallel_num)

    def _ask(self, point: dict | None) -> tuple[Any, dict] | str | None:
        solution = self._opt.suggest()
        if solution is None and not self._live:
            # SRacosTune closes after its initial samples until the last of them completes;
            # if that happened before it closed (one trial at a time), it would never reopen
            # and the search would hang: nothing is in flight, so reopen it.
            self._opt.semaphore = 1
            solution = self._opt.suggest()
        if solution == "FINISHED":
            return Searcher.FINISHED
        if solution is None:
            return None
        return solution, dict(zip(self._keys, solution.get_x()))

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        self._worst = max(loss, getattr(self, "_worst", loss))
        self._opt.complete(handle, loss)

    def _tell_failed(self, handle: Any, params: dict) -> None:
        # ZOOpt counts every asked solution until it completes: a failed one counts as
        # the worst seen, so its initial phase still ends
        self._opt.complete(handle, getattr(self, "_worst", 0.0))
