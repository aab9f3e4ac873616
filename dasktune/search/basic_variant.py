"""Random and grid search: Ray's ``BasicVariantGenerator``.

For each of ``num_samples`` samples it yields every grid variant in Ray's order, drawing the
random parts afresh for each (or once per sample with ``constant_grid_search=True``).
``points_to_evaluate`` come first; each is merged over the param space (it may be partial,
its own grid_search entries still expand) and uses up one of the samples, as in Ray.

Its position is a few counters plus the numpy generator's state, so :meth:`get_state` is
plain data and a restored search yields exactly the trials the first one had not.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from dasktune import space as sp
from dasktune.search._base import SearchAlgorithm, Suggestion, check_num_samples

__all__ = ["BasicVariantGenerator"]

logger = logging.getLogger(__name__)


class BasicVariantGenerator(SearchAlgorithm):
    """Grid and random search over a param space (Ray's ``BasicVariantGenerator``).

    Args:
        points_to_evaluate: configs (possibly partial) to run first.
        max_concurrent: at most this many trials in flight (0: no limit).
        constant_grid_search: draw random values once per sample and keep them for every
            grid variant of that sample.
        random_state: a seed, numpy ``Generator``/``RandomState``, or None; if None, the
            ``seed`` keyword of :meth:`set_search_properties` is used when given.
        experiment_uid: the 8-hex trial-id prefix (default: random).
    """

    def __init__(
        self,
        points_to_evaluate: list[dict] | None = None,
        max_concurrent: int = 0,
        constant_grid_search: bool = False,
        random_state: Any = None,
        *,
        experiment_uid: str | None = None,
    ) -> None:
        super().__init__(experiment_uid=experiment_uid)
        points = [] if points_to_evaluate is None else points_to_evaluate
        if not isinstance(points, (list, tuple)) or not all(isinstance(p, Mapping) for p in points):
            raise TypeError(f"points_to_evaluate must be a list of dicts, got {points!r}")
        if not isinstance(max_concurrent, int) or max_concurrent < 0:
            raise ValueError(f"max_concurrent must be an int >= 0, got {max_concurrent!r}")
        self._points = [dict(p) for p in points]
        self._max_concurrent = max_concurrent
        self._seeded = random_state is not None
        self._rng = sp.as_generator(random_state)
        self._constant_grid_search = constant_grid_search
        self._space: dict[str, Any] | None = None
        self._num_samples: int | None = 1
        self._variants: list[tuple[dict, dict]] = []
        self._total: int | None = None
        # position: points used, random samples started, the current batch of grid variants
        self._points_done = 0
        self._samples_done = 0
        self._batch_point: int | None = None  # index of the point the batch came from
        self._batch_cache: list[tuple[dict, dict]] | None = None
        self._batch_index = 0
        self._batch_fixed: dict[tuple, Any] | None = None
        self._in_batch = False
        self._live: set[str] = set()

    def set_search_properties(
        self, metric: Any, mode: Any, config: dict, **spec: Any
    ) -> bool:
        """Take the param space (``config``) and ``num_samples`` (-1: unbounded)."""
        super().set_search_properties(metric, mode, config, **spec)
        config = {} if config is None else config
        sp.validate_param_space(config)
        self._space = dict(config)
        self._num_samples = check_num_samples(spec.get("num_samples", 1), "BasicVariantGenerator")
        if not self._seeded and spec.get("seed") is not None:
            self._rng = sp.as_generator(spec["seed"])
            self._seeded = True
        self._variants = sp.expand_grid(self._space)
        self._batch_cache = None
        point_total = sum(len(self._point_variants(i)) for i in range(len(self._points)))
        if self._num_samples is None:
            self._total = None
        else:
            rest = max(self._num_samples - len(self._points), 0)
            self._total = point_total + rest * len(self._variants)
        return True

    @property
    def total_samples(self) -> int | None:
        return self._total

    def _point_variants(self, index: int) -> list[tuple[dict, dict]]:
        assert self._space is not None
        return sp.expand_grid(_merge_point(self._space, self._points[index], ()))

    def _batch(self) -> list[tuple[dict, dict]]:
        if self._batch_point is None:
            return self._variants
        if self._batch_cache is None:
            self._batch_cache = self._point_variants(self._batch_point)
        return self._batch_cache

    def _start_batch(self) -> bool:
        """Move to the next point or random sample; False when there is none."""
        if self._points_done < len(self._points):
            self._batch_point = self._points_done
            self._points_done += 1
        elif self._num_samples is None or (
            self._samples_done < self._num_samples - len(self._points)
        ):
            self._batch_point = None
            self._samples_done += 1
        else:
            return False
        self._batch_cache = None
        self._batch_index = 0
        self._in_batch = True
        self._batch_fixed = None
        if self._constant_grid_search:
            self._batch_fixed = sp.sample_domains(self._batch()[0][1], self._rng)
        return True

    @property
    def suggests_ahead(self) -> bool:
        """Variants ignore results: they may be asked for before a slot is free."""
        return True

    def next_trial(self) -> Suggestion | None:
        """The next variant, or None if finished or ``max_concurrent`` trials are live."""
        if self._space is None:
            raise RuntimeError("BasicVariantGenerator: call set_search_properties() first")
        if self._finished:
            return None
        if self._max_concurrent and len(self._live) >= self._max_concurrent:
            return None
        while not self._in_batch or self._batch_index >= len(self._batch()):
            if not self._start_batch():
                self._finished = True
                return None
        grid_vars, spec = self._batch()[self._batch_index]
        self._batch_index += 1
        config, resolved = sp.resolve(spec, self._rng, fixed=self._batch_fixed)
        # The variant was built from list copies: the tuples of the param space and of
        # the chosen grid values come back (grid values first: tuples are immutable).
        for path, value in grid_vars.items():
            node = config
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = sp.restore_tuples(value, node[path[-1]])
        config = sp.restore_tuples(self._space, config)
        tag_vars = {**grid_vars, **resolved}
        tag = str(self._counter) + (f"_{sp.format_vars(tag_vars)}" if tag_vars else "")
        trial_id = self._trial_id()
        self._counter += 1
        self._live.add(trial_id)
        return Suggestion(trial_id=trial_id, config=config, experiment_tag=tag)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)

    def get_state(self) -> dict:
        state = super().get_state()
        state.update(
            points_done=self._points_done,
            samples_done=self._samples_done,
            batch_point=self._batch_point,
            batch_index=self._batch_index,
            in_batch=self._in_batch,
            batch_fixed=None
            if self._batch_fixed is None
            else [[list(p), copy.deepcopy(v)] for p, v in self._batch_fixed.items()],
            rng=self._rng.bit_generator.state,
            live=sorted(self._live),
        )
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._points_done = state["points_done"]
        self._samples_done = state["samples_done"]
        self._batch_point = state["batch_point"]
        self._batch_index = state["batch_index"]
        self._in_batch = state["in_batch"]
        fixed = state["batch_fixed"]
        self._batch_fixed = None if fixed is None else {tuple(p): v for p, v in fixed}
        self._batch_cache = None
        rng_state = state["rng"]
        self._rng = np.random.Generator(getattr(np.random, rng_state["bit_generator"])())
        self._rng.bit_generator.state = rng_state
        self._live = set(state["live"])


def _merge_point(space: Any, point: Any, path: tuple) -> Any:
    """``point`` laid over ``space``: every key of the point must exist in the space."""
    if isinstance(point, Mapping) and isinstance(space, Mapping) and not sp.is_grid(space):
        merged = sp.copy_containers(space)
        for key, value in point.items():
            if key not in space:
                name = sp.path_str((*path, key))
                raise ValueError(f"points_to_evaluate: key '{name}' is not in the param_space")
            merged[key] = _merge_point(space[key], value, (*path, key))
        return merged
    name = sp.path_str(path)
    if sp.is_grid(space) and point not in space["grid_search"]:
        logger.warning("point value %r for '%s' is not one of its grid values", point, name)
    elif isinstance(space, sp.Domain) and not space.is_valid(point):
        logger.warning("point value %r for '%s' is outside %s", point, name, space.domain_str)
    return copy.deepcopy(point)
