"""``NevergradSearch``: a Nevergrad optimizer behind the :class:`Searcher` contract (Ray's).

Nevergrad's own ask-and-tell: ``suggest`` is ``optimizer.ask()``, completion
``optimizer.tell(candidate, loss)``; ``points_to_evaluate`` go through
``optimizer.suggest(**point)`` so the next ask returns them, in order.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._library import LibrarySearcher, import_library

ng = import_library("nevergrad", "nevergrad", "NevergradSearch")

__all__ = ["NevergradSearch"]


class NevergradSearch(LibrarySearcher):
    """Search with a Nevergrad optimizer (Ray's ``ray.tune.search.nevergrad.NevergradSearch``).

    Args:
        optimizer: an optimizer class or configured optimizer (``ng.optimizers.OnePlusOne``,
            ``ng.optimizers.CMA``...), built on the space; or an optimizer instance, which
            brings its own parametrization (then ``space`` stays None).
        optimizer_kwargs: extra arguments for building ``optimizer`` (``budget``,
            ``num_workers``).
        space: a dasktune param space, or a Nevergrad parametrization (``ng.p.Dict`` or
            ``ng.p.Instrumentation`` with keyword parameters); None: the Tuner's
            ``param_space``.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, in order.
    """

    _library = "Nevergrad"

    def __init__(
        self,
        optimizer: Any = None,
        optimizer_kwargs: dict | None = None,
        space: dict | Any | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
    ) -> None:
        self._given: Any = None
        self._factory: Any = None
        if optimizer is None:
            raise ValueError("NevergradSearch needs an optimizer, e.g. ng.optimizers.OnePlusOne")
        if isinstance(optimizer, ng.optimization.Optimizer):
            if space is not None:
                raise ValueError(
                    "NevergradSearch: an optimizer instance has its own parametrization; "
                    "pass space=None (or pass the optimizer class instead)"
                )
            if optimizer_kwargs:
                raise ValueError("NevergradSearch: optimizer_kwargs need an optimizer class")
            self._given = optimizer
            space = optimizer.parametrization
        elif isinstance(optimizer, ng.optimizers.base.ConfiguredOptimizer) or (
            inspect.isclass(optimizer) and issubclass(optimizer, ng.optimization.Optimizer)
        ):
            self._factory = optimizer
        else:
            raise TypeError(
                "NevergradSearch: optimizer must be a Nevergrad optimizer class, configured "
                f"optimizer or instance, got {optimizer!r}"
            )
        self._optimizer_kwargs = dict(optimizer_kwargs or {})
        super().__init__(space, metric, mode, points_to_evaluate)

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, ng.p.Parameter)

    def _convert(self, space: dict) -> Any:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: Mapping[str, Any]) -> Any:
        """A dasktune param space as an ``ng.p.Dict`` keyed by ``"/"``-joined paths."""
        params = {}
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"NevergradSearch can't take grid_search (at '{name}')")
            if isinstance(value, sp.Domain):
                params[name] = _to_nevergrad(name, value)
        return ng.p.Dict(**params)

    def _setup(self) -> Any:
        if self._given is not None:
            return self._given
        return self._factory(parametrization=self._space, **self._optimizer_kwargs)

    def _values(self, candidate: Any) -> dict:
        if isinstance(self._space, ng.p.Instrumentation):
            return dict(candidate.kwargs)
        return dict(candidate.value)

    def _ask(self, point: dict | None) -> tuple[Any, dict]:
        if point is not None:
            if isinstance(self._space, ng.p.Instrumentation):
                self._opt.suggest(**point)
            else:
                self._opt.suggest(point)
        candidate = self._opt.ask()
        return candidate, self._values(candidate)

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        self._opt.tell(handle, loss)


def _to_nevergrad(name: str, domain: sp.Domain) -> Any:
    if isinstance(domain, sp.Categorical):
        return ng.p.Choice(domain.categories)
    if isinstance(domain, sp.Function) or getattr(domain, "sampler", None) == "normal":
        raise ValueError(f"NevergradSearch can't take {domain!r} (at '{name}')")
    if domain.q is not None:
        raise ValueError(f"NevergradSearch can't quantize (at '{name}'): drop .quantized()")
    if isinstance(domain, sp.Integer):  # upper is exclusive
        lower, upper = domain.lower, domain.upper - 1
        param = ng.p.Log(lower=lower, upper=upper) if domain.sampler == "loguniform" else \
            ng.p.Scalar(lower=lower, upper=upper)
        return param.set_integer_casting()
    if domain.sampler == "loguniform":
        return ng.p.Log(lower=domain.lower, upper=domain.upper)
    return ng.p.Scalar(lower=domain.lower, upper=domain.upper)
