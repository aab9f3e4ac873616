"""``TuneBOHB``: BOHB's model (hpbandster + ConfigSpace) behind the :class:`Searcher` contract.

BOHB fits a KDE per budget; it learns from the results a trial reports at a HyperBand
milestone, which :class:`~dasktune.schedulers.hb_bohb.HyperBandForBOHB` marks with
``result["hyperband_info"]["budget"]`` (as in Ray, completion alone teaches it nothing: use
it with that scheduler). A trial that reported a budget is paused by the scheduler until it
reports again; it does not count toward ``max_concurrent``, so paused brackets fill up with
new trials instead of blocking them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dasktune import space as sp
from dasktune.search._library import LibrarySearcher, import_library

ConfigSpace = import_library("ConfigSpace", "bohb", "TuneBOHB")
import_library("hpbandster", "bohb", "TuneBOHB")
from hpbandster.optimizers.config_generators.bohb import BOHB  # noqa: E402

__all__ = ["TuneBOHB"]

logger = logging.getLogger(__name__)


class _Job:
    """What hpbandster's ``new_result`` reads of a finished run (its ``Job``'s fields)."""

    def __init__(self, loss: float, budget: float, config: dict) -> None:
        self.result = {"loss": loss}
        self.kwargs = {"budget": budget, "config": config}
        self.exception = None


class TuneBOHB(LibrarySearcher):
    """BOHB (Ray's ``ray.tune.search.bohb.TuneBOHB``); pair it with ``HyperBandForBOHB``.

    Args:
        space: a dasktune param space or a ``ConfigSpace.ConfigurationSpace``; None: the
            Tuner's ``param_space``.
        bohb_config: arguments of hpbandster's BOHB config generator (``min_points_in_model``,
            ``top_n_percent``, ``num_samples``, ``random_fraction``, ...).
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, in order.
        seed: seeds the ConfigSpace's sampling.
        max_concurrent: trials running at once, paused ones not counted (0: no limit; a
            ``ConcurrencyLimiter`` around it sets this).
    """

    _library = "ConfigSpace"

    def __init__(
        self,
        space: dict | Any | None = None,
        bohb_config: dict | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        seed: int | None = None,
        max_concurrent: int = 0,
    ) -> None:
        self._bohb_config = dict(bohb_config or {})
        self._seed = seed
        self._max_concurrent = max_concurrent
        self.paused: set[str] = set()
        self._warned = False
        self._budgeted = False  # a result from HyperBandForBOHB was seen
        super().__init__(space, metric, mode, points_to_evaluate)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._max_concurrent = max_concurrent
        return True

    def _is_native(self, space: Any) -> bool:
        return isinstance(space, ConfigSpace.ConfigurationSpace)

    def _convert(self, space: dict) -> Any:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: Mapping[str, Any]) -> Any:
        """A dasktune param space as a ``ConfigurationSpace`` (names: ``"/"``-joined paths)."""
        cs = ConfigSpace.ConfigurationSpace()
        for path, value in sp.leaves(spec):
            name = sp.path_str(path)
            if sp.is_grid(value):
                raise ValueError(f"TuneBOHB can't take grid_search (at '{name}')")
            if not isinstance(value, sp.Domain):
                continue
            if isinstance(value, sp.Categorical):
                cs.add(ConfigSpace.CategoricalHyperparameter(name, choices=value.categories))
                continue
            if isinstance(value, sp.Function) or value.sampler == "normal" or value.q:
                raise ValueError(
                    f"TuneBOHB takes uniform or log-uniform numbers and choices; '{name}' is "
                    f"{value!r}"
                )
            log = value.sampler == "loguniform"
            if isinstance(value, sp.Float):
                cs.add(ConfigSpace.UniformFloatHyperparameter(
                    name, lower=value.lower, upper=value.upper, log=log))
            else:  # upper is exclusive
                cs.add(ConfigSpace.UniformIntegerHyperparameter(
                    name, lower=value.lower, upper=value.upper - 1, log=log))
        return cs

    def _take_seed(self, seed: int) -> None:
        if self._seed is None:
            self._seed = seed

    def _setup(self) -> Any:
        if self._seed is not None:
            self._space.seed(self._seed)
        return BOHB(self._space, **self._bohb_config)

    def _ask(self, point: dict | None) -> tuple[Any, dict] | None:
        running = len(self._live) - len(self.paused)
        if self._max_concurrent > 0 and running >= self._max_concurrent:
            return None
        if point is not None:
            return None, dict(point)
        config, _info = self._opt.get_config(None)  # the budget argument is unused
        return None, dict(config)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._live:
            return
        info = result.get("hyperband_info")
        if info is None:
            return  # not judged by HyperBandForBOHB (another scheduler, or a late report)
        self._budgeted = True
        if "budget" not in info:
            self.paused.discard(trial_id)  # it runs (again)
            return
        self.paused.add(trial_id)  # HyperBandForBOHB pauses it at the milestone
        value = result.get(self._metric)
        if value is not None and value == value:
            params = self._live[trial_id][1]
            self._opt.new_result(_Job(self._sign() * float(value), info["budget"], params))

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self.paused.discard(trial_id)
        self._live.pop(trial_id, None)  # BOHB learned from the milestones already
        if not self._budgeted and not self._warned:
            logger.warning("TuneBOHB: a trial completed with no hyperband_info in its results; "
                           "use HyperBandForBOHB as the scheduler, or BOHB learns nothing")
            self._warned = True

    def on_pause(self, trial_id: str) -> None:
        """Ray's hook: ``trial_id`` was paused (not counted as running)."""
        self.paused.add(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        """Ray's hook: ``trial_id`` runs again."""
        self.paused.discard(trial_id)

    def add_evaluated_point(self, parameters: dict, value: Any, error: bool = False,
                            pruned: bool = False,
                            intermediate_values: list[float] | None = None) -> None:
        """Not for BOHB (as in Ray): it learns per budget, from HyperBand's milestones."""
        raise NotImplementedError("TuneBOHB takes results at HyperBand milestones only")
