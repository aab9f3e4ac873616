"""``AxSearch``: Ax 1.x (``ax.Client``) behind the :class:`Searcher` contract (Ray's).

Ray 2.60's adapter drives Ax's old ``AxClient`` and fails on Ax 1.x; this one uses Ax's
current public API: ``Client.configure_experiment`` / ``configure_optimization``, then
``get_next_trials(max_trials=1)`` per suggestion, ``complete_trial`` with the metric (and
the metrics named in ``outcome_constraints``) or ``mark_trial_failed``; a point to evaluate
is ``attach_trial``\\ ed. Ax takes the direction from the objective (``"-loss"`` minimizes),
so it is told raw metric values. State: the Client is pickled with the searcher.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._library import LibrarySearcher, import_library

ax = import_library("ax", "ax", "AxSearch")

__all__ = ["AxSearch"]

_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


class AxSearch(LibrarySearcher):
    """Bayesian optimization with Ax (Ray's ``ray.tune.search.ax.AxSearch``, on Ax 1.x).

    Args:
        space: a dasktune param space, or Ax's parameter list (dicts with ``name``,
            ``type`` = ``"range"`` / ``"choice"`` / ``"fixed"``, ``bounds`` / ``values`` /
            ``value``, ``value_type``, ``log_scale``, ``is_ordered``), or a list of Ax 1.x
            ``RangeParameterConfig`` / ``ChoiceParameterConfig``; None: the Tuner's
            ``param_space``.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, attached to the experiment.
        parameter_constraints: Ax's strings, e.g. ``["x1 + x2 <= 2.0"]``.
        outcome_constraints: Ax's strings, e.g. ``["l2norm <= 1.25"]``; the metrics they
            name are read from each trial's last result.
        ax_client: an ``ax.Client`` whose experiment and optimization are configured
            already (then space, constraints and ``ax_kwargs`` are not used).
        **ax_kwargs: ``random_seed`` for the Client; the rest go to
            ``Client.configure_generation_strategy`` (``method``, ``initialization_budget``...).
    """

    _library = "Ax"

    def __init__(
        self,
        space: dict | list | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        parameter_constraints: list[str] | None = None,
        outcome_constraints: list[str] | None = None,
        ax_client: Any = None,
        **ax_kwargs: Any,
    ) -> None:
        if ax_client is not None and not isinstance(ax_client, ax.Client):
            raise TypeError(
                "AxSearch: ax_client must be an Ax 1.x ax.Client (Ax's old AxClient is not "
                f"supported), got {type(ax_client).__name__}"
            )
        self._client = ax_client
        self._parameter_constraints = list(parameter_constraints or [])
        self._outcome_constraints = list(outcome_constraints or [])
        self._seed = ax_kwargs.pop("random_seed", None)
        self._gs_kwargs = ax_kwargs
        self._fixed: dict[str, Any] = {}  # Ax's "fixed" parameters: constants of the config
        super().__init__(space, metric, mode, points_to_evaluate)
        if ax_client is not None and self._space is None:
            self._space = []  # the client's experiment is the space
            self._own_space = True

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, list)

    def _convert(self, space: dict) -> list:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: Mapping[str, Any]) -> list:
        """A dasktune param space as Ax 1.x parameter configs (names: ``"/"``-joined paths)."""
        params = []
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"AxSearch can't take grid_search (at '{name}')")
            if isinstance(value, sp.Domain):
                params.append(_to_ax(name, value))
        return params

    def _take_seed(self, seed: int) -> None:
        if self._seed is None:
            self._seed = seed

    def _setup(self) -> Any:
        if self._client is not None:
            return self._client
        client = ax.Client(random_seed=self._seed)
        params = []
        for p in self._space:
            if isinstance(p, Mapping):
                if p.get("type") == "fixed":
                    self._fixed[p["name"]] = p["value"]
                    continue
                p = _from_ax_dict(p)
            params.append(p)
        client.configure_experiment(
            parameters=params, parameter_constraints=self._parameter_constraints or None)
        objective = self._metric if self._mode == "max" else f"-{self._metric}"
        client.configure_optimization(
            objective=objective, outcome_constraints=self._outcome_constraints or None)
        if self._gs_kwargs:
            client.configure_generation_strategy(**self._gs_kwargs)
        return client

    def _ask(self, point: dict | None) -> tuple[Any, dict] | None:
        if point is not None:
            params = {k: v for k, v in point.items() if k not in self._fixed}
            return self._opt.attach_trial(parameters=params), params
        trials = self._opt.get_next_trials(max_trials=1)
        if not trials:
            return None  # Ax waits for results before it generates more
        [(index, params)] = trials.items()
        return index, dict(params)

    def _config(self, params: dict) -> dict:
        return super()._config({**self._fixed, **params})

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        raw = {self._metric: self._sign() * loss}
        for key, value in result.items():
            if key != self._metric and isinstance(value, (int, float)) and any(
                re.search(rf"(?<![\w.]){re.escape(str(key))}(?![\w.])", c)
                for c in self._outcome_constraints
            ):
                raw[key] = float(value)
        self._opt.complete_trial(trial_index=handle, raw_data=raw)

    def _tell_failed(self, handle: Any, params: dict) -> None:
        self._opt.mark_trial_failed(trial_index=handle)


def _to_ax(name: str, domain: sp.Domain) -> Any:
    if isinstance(domain, sp.Categorical):
        kinds = {type(c) for c in domain.categories}
        if len(kinds) != 1 or next(iter(kinds)) not in _TYPES:
            raise ValueError(
                f"AxSearch: the choices of '{name}' must all be bool, int, float or str"
            )
        return ax.ChoiceParameterConfig(
            name=name, values=list(domain.categories),
            parameter_type=_TYPES[next(iter(kinds))], is_ordered=False)
    if isinstance(domain, sp.Function) or domain.sampler == "normal":
        raise ValueError(f"AxSearch can't take {domain!r} (at '{name}')")
    scaling = "log" if domain.sampler == "loguniform" else "linear"
    if isinstance(domain, sp.Float):
        if domain.q is not None:
            raise ValueError(f"AxSearch can't quantize a float (at '{name}')")
        return ax.RangeParameterConfig(name=name, bounds=(domain.lower, domain.upper),
                                       parameter_type="float", scaling=scaling)
    if domain.q is not None:
        raise ValueError(f"AxSearch can't quantize an int (at '{name}')")
    return ax.RangeParameterConfig(name=name, bounds=(domain.lower, domain.upper - 1),
                                   parameter_type="int", scaling=scaling)


def _from_ax_dict(p: Mapping[str, Any]) -> Any:
    """One parameter of Ax's old dict form as an Ax 1.x parameter config."""
    kind = p.get("type")
    if kind == "range":
        low, high = p["bounds"]
        ptype = p.get("value_type") or ("int" if isinstance(low, int) and isinstance(high, int)
                                        else "float")
        return ax.RangeParameterConfig(name=p["name"], bounds=(low, high), parameter_type=ptype,
                                       scaling="log" if p.get("log_scale") else "linear")
    if kind == "choice":
        values = list(p["values"])
        ptype = p.get("value_type") or _TYPES.get(type(values[0]), "str")
        return ax.ChoiceParameterConfig(name=p["name"], values=values, parameter_type=ptype,
                                        is_ordered=p.get("is_ordered"))
    raise ValueError(f"AxSearch: unknown Ax parameter type {kind!r} in {dict(p)!r}")
