"""What every searcher that puts an optimization library behind Ray's :class:`Searcher` shares.

A subclass of :class:`LibrarySearcher` translates a param space into its library's form
(:meth:`~LibrarySearcher._convert`), builds the library's optimizer (``_setup``), and asks and
tells it (``_ask``, ``_tell``). This base does the rest, the same way for all of them:

- ``metric``/``mode`` from the constructor or ``TuneConfig``; the space from the constructor
  (dasktune domains or the library's own form) or the Tuner's ``param_space``;
- ``points_to_evaluate`` asked first, in order; ``evaluated_rewards`` told before any ask;
- the library minimizes a *loss*: the metric for ``"min"``, its negation for ``"max"``;
- trials in flight (trial id -> the library's handle), failed trials and NaN metrics;
- state: :meth:`get_state` cloudpickles the attributes (optimizer included), so a restored
  searcher continues the same search; trials in flight at save time can still complete.

Parameter names are paths joined with ``"/"`` (``"model/lr"``); configs come back nested
like the param space, its constants included.
"""

from __future__ import annotations

import copy
import importlib
import math
import pickle
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import cloudpickle
import numpy as np

from dasktune import space as sp
from dasktune.search._base import Searcher

__all__ = ["LibrarySearcher", "import_library"]


def import_library(module: str, extra: str, needed_by: str) -> ModuleType:
    """Import ``module`` or raise a one-line ImportError naming the pip extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f'{needed_by} needs {module.split(".")[0]}: pip install "dasktune[{extra}]"'
        ) from exc


class LibrarySearcher(Searcher):
    """A :class:`Searcher` over an ask/tell optimization library (see the module docstring).

    Subclasses implement ``_is_native``, ``_convert``, ``_setup``, ``_ask`` and ``_tell``;
    ``_tell_failed`` and ``_config`` have defaults.
    """

    _library = "the library"  # its name, for messages

    def __init__(
        self,
        space: Any = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        evaluated_rewards: list | None = None,
    ) -> None:
        name = type(self).__name__
        if isinstance(metric, (list, tuple)) or isinstance(mode, (list, tuple)):
            raise ValueError(f"{name} optimizes one metric: metric and mode must be strings")
        super().__init__(metric=metric, mode=mode)
        if points_to_evaluate is not None and not (
            isinstance(points_to_evaluate, (list, tuple))
            and all(isinstance(p, Mapping) for p in points_to_evaluate)
        ):
            raise TypeError(f"{name}: points_to_evaluate must be a list of dicts")
        if evaluated_rewards is not None and (
            points_to_evaluate is None or len(evaluated_rewards) != len(points_to_evaluate)
        ):
            raise ValueError(
                f"{name}: evaluated_rewards needs points_to_evaluate of the same length (got "
                f"{len(evaluated_rewards)} rewards for {len(points_to_evaluate or [])} points)"
            )
        self._points = [copy.deepcopy(dict(p)) for p in points_to_evaluate or []]
        self._rewards = list(evaluated_rewards) if evaluated_rewards is not None else None
        self._template: dict | None = None  # the dasktune param space, when given one
        self._paths: dict[str, tuple] = {}  # parameter name -> its path in the template
        self._space: Any = None  # the space in the library's form
        self._own_space = False  # given to the constructor (not the Tuner's param_space)
        self._opt: Any = None  # the library's optimizer, built at the first ask
        self._live: dict[str, tuple[Any, dict]] = {}  # trial id -> (handle, flat params)
        if space is not None and (not isinstance(space, Mapping) or space):
            self._take_space(space)
            self._own_space = True

    # -- what a subclass implements --------------------------------------------------

    def _is_native(self, space: Any) -> bool:
        """Whether ``space`` is in the library's own form (not a dasktune param space)."""
        raise NotImplementedError

    def _convert(self, space: dict) -> Any:
        """Translate a dasktune param space (grid-free, with domains) to the library's form."""
        raise NotImplementedError

    def _setup(self) -> Any:
        """Build the library's optimizer (metric, mode and ``self._space`` are set)."""
        raise NotImplementedError

    def _ask(self, point: dict | None) -> tuple[Any, dict] | str | None:
        """Ask the library: ``(handle, flat params)``; ``point`` (flat) is one to evaluate.
        None means "nothing now" (e.g. a batch is still out), :attr:`Searcher.FINISHED`
        "no more"."""
        raise NotImplementedError

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        """Tell the library the loss (lower is better) of an asked trial."""
        raise NotImplementedError

    def _tell_failed(self, handle: Any, params: dict) -> None:
        """An asked trial failed or has no value. Default: the library never hears of it."""

    def _observe(self, params: dict, loss: float) -> None:
        """Tell the library of a point evaluated elsewhere. Default: ask it, then tell."""
        asked = self._ask(params)
        if not isinstance(asked, tuple):
            raise RuntimeError(f"{type(self).__name__} could not take an evaluated point now")
        self._tell(asked[0], asked[1], loss, {})

    def _config(self, params: dict) -> dict:
        """A trial's config from flat params: nested like the param space."""
        params = {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}
        if self._template is None:
            return sp.unflatten(params)
        config = sp.copy_containers(self._template)
        for name, value in params.items():
            sp.assign_path(config, self._paths[name], value)
        return sp.restore_tuples(self._template, config)

    # -- space --------------------------------------------------------------------------

    def _take_space(self, space: Any) -> None:
        name = type(self).__name__
        if self._is_native(space):
            self._space, self._template, self._paths = space, None, {}
            return
        if not isinstance(space, Mapping):
            raise TypeError(
                f"{name}: space must be a dasktune param space (a dict) or {self._library}'s "
                f"own search space, got {type(space).__name__}"
            )
        sp.validate_param_space(space)
        grids = [sp.path_str(p) for p, v in sp.leaves(space) if sp.is_grid(v)]
        if grids:
            raise ValueError(
                f"{name} can't take grid_search (at {', '.join(repr(g) for g in grids)}); "
                "use tune.choice(...)"
            )
        domains = [(p, v) for p, v in sp.leaves(space) if isinstance(v, sp.Domain)]
        if not domains:
            return  # constants only: no search space (the Tuner's may come later)
        for path, value in domains:
            if isinstance(value, sp.Function):
                raise ValueError(
                    f"{name} can't take sample_from (at '{sp.path_str(path)}'): "
                    f"{self._library} must know every parameter's distribution"
                )
        self._template = dict(space)
        self._paths = {sp.path_str(p): p for p, _ in domains}
        self._space = self._convert(dict(space))

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        """Take the Tuner's metric, mode and param space.

        Returns False if this searcher has its own space and ``config`` defines parameters
        as well, or if metric/mode contradict its own.
        """
        if isinstance(metric, (list, tuple)) or isinstance(mode, (list, tuple)):
            raise ValueError(f"{type(self).__name__} optimizes one metric, got {metric!r}")
        if not super().set_search_properties(metric, mode, config, **spec):
            return False
        config = dict(config or {})
        if self._own_space:
            return not sp.has_unresolved_values(config)
        if self._opt is None:
            self._take_space(config)
        if spec.get("seed") is not None:
            self._take_seed(spec["seed"])
        return True

    def _take_seed(self, seed: int) -> None:
        """``TuneConfig(seed=...)``; subclasses with a seed argument use it if none was given."""

    def _flat_point(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """A nested point as flat params; names outside the space are an error."""
        if self._template is None:
            return sp.flatten_space(dict(point))
        known = {sp.path_str(p) for p, _ in sp.leaves(self._template)}
        unknown = sorted(
            name for name in (sp.path_str(p) for p, _ in sp.leaves(point))
            # a choice's value may be a list or dict itself: known through its parameter
            if name not in known and not any(name.startswith(f"{k}{sp.SEP}") for k in known)
        )
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: points_to_evaluate names {unknown} outside the search "
                f"space ({', '.join(sorted(self._paths))})"
            )
        flat, missing = {}, []
        for name, path in self._paths.items():
            node: Any = point
            try:
                for key in path:
                    node = node[key]
            except (KeyError, IndexError, TypeError):
                missing.append(name)
                continue
            flat[name] = node
        if missing:
            raise ValueError(
                f"{type(self).__name__}: a point in points_to_evaluate lacks {missing}"
            )
        return flat

    # -- the Searcher hooks ---------------------------------------------------------------

    def _sign(self) -> float:
        return -1.0 if self._mode == "max" else 1.0

    def _ensure(self) -> None:
        name = type(self).__name__
        if self._opt is not None:
            return
        if self._space is None:
            raise RuntimeError(
                f"{name} has no search space: pass space= or put parameters (tune.uniform, "
                "tune.choice, ...) in the Tuner's param_space"
            )
        if self._metric is None or self._mode is None:
            raise RuntimeError(f"{name} needs metric and mode: pass them to {name} or TuneConfig")
        self._opt = self._setup()
        if self._rewards is not None:
            for point, reward in zip(self._points, self._rewards, strict=True):
                self._observe(self._flat_point(point), self._sign() * float(reward))
            self._points, self._rewards = [], None

    def suggest(self, trial_id: str) -> dict | None | str:
        self._ensure()
        if trial_id in self._live:
            return self._config(self._live[trial_id][1])
        point = self._flat_point(self._points[0]) if self._points else None
        asked = self._ask(point)
        if asked is None or asked == Searcher.FINISHED:
            return asked
        if point is not None:
            self._points.pop(0)
        self._live[trial_id] = asked
        return self._config(asked[1])

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        entry = self._live.pop(trial_id, None)
        if entry is None:
            return
        handle, params = entry
        metric = self._metric
        if error or not result:
            self._tell_failed(handle, params)
            return
        if metric not in result:
            raise ValueError(
                f"{type(self).__name__}: metric {metric!r} is not in the result of trial "
                f"{trial_id} (keys: {', '.join(sorted(map(str, result)))})"
            )
        value = float(result[metric])
        if math.isnan(value):
            self._tell_failed(handle, params)
            return
        self._tell(handle, params, self._sign() * value, result)

    def add_evaluated_point(
        self,
        parameters: dict,
        value: float | list[float],
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """Tell the library of a config evaluated elsewhere (failed ones are skipped)."""
        if error or value is None:
            return
        self._ensure()
        self._observe(self._flat_point(parameters), self._sign() * float(value))  # type: ignore[arg-type]

    # -- state --------------------------------------------------------------------------

    def get_state(self) -> dict:
        return {"class": type(self).__name__, "blob": cloudpickle.dumps(self._state_dict())}

    def set_state(self, state: dict) -> None:
        if state.get("class") != type(self).__name__:
            raise ValueError(
                f"{type(self).__name__} can't restore the state of {state.get('class')!r}"
            )
        self._load_state_dict(pickle.loads(state["blob"]))

    def _state_dict(self) -> dict:
        """What :meth:`get_state` pickles; subclasses drop or convert unpicklable parts."""
        return dict(self.__dict__)

    def _load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)
