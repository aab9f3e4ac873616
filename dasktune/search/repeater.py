"""``Repeater``: run each suggestion ``repeat`` times and report the mean (Ray's)."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

from dasktune.search._base import Searcher
from dasktune.search._wrapper import WrapperSearcher

__all__ = ["TRIAL_INDEX", "Repeater"]

logger = logging.getLogger(__name__)

TRIAL_INDEX = "__trial_index__"


class Repeater(WrapperSearcher):
    """Repeat every config of ``searcher`` ``repeat`` times (e.g. over seeds).

    The inner searcher sees one trial per group, under the first trial's id, completed once
    every repeat has completed, with the result ``{metric: mean}`` (as Ray): the mean over
    the repeats that reported it (NaN and failed ones are skipped; if none reported, the
    group counts as an error).
    With ``set_index`` each config gets ``config["__trial_index__"]`` = its repeat number.
    Intermediate results are not forwarded: they belong to single repeats.
    """

    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True) -> None:
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
        super().__init__(searcher)
        self.repeat = repeat
        self._set_index = set_index
        # each group: {"primary": id, "config": dict, "results": {trial_id: None | {"result": ...}}}
        self._groups: list[dict[str, Any]] = []
        self._group_of: dict[str, int] = {}

    def suggest(self, trial_id: str) -> dict | None | str:
        group = self._groups[-1] if self._groups else None
        if group is None or len(group["results"]) >= self.repeat:
            config = self.searcher.suggest(trial_id)
            if config is None or config == Searcher.FINISHED:
                return config
            group = {"primary": trial_id, "config": copy.deepcopy(config), "results": {}}
            self._groups.append(group)
        index = len(group["results"])
        group["results"][trial_id] = None
        self._group_of[trial_id] = len(self._groups) - 1
        config = copy.deepcopy(group["config"])
        if self._set_index:
            config[TRIAL_INDEX] = index
        return config

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if trial_id not in self._group_of:
            logger.warning("Repeater: trial %s was not suggested by this searcher", trial_id)
            return
        group = self._groups[self._group_of[trial_id]]
        group["results"][trial_id] = {"result": None if error else dict(result or {})}
        done = list(group["results"].values())
        if len(done) < self.repeat or any(r is None for r in done):
            return
        metrics = self.searcher.metric
        names = metrics if isinstance(metrics, (list, tuple)) else [metrics]
        if metrics is None:
            raise ValueError("Repeater: the inner searcher has no metric to average")
        averaged: dict[str, Any] = {}
        for name in names:
            values = [
                float(r["result"][name])
                for r in done
                if r["result"] is not None
                and r["result"].get(name) is not None
                and not math.isnan(float(r["result"][name]))
            ]
            if values:
                averaged[name] = sum(values) / len(values)
        if len(averaged) < len(names):
            self.searcher.on_trial_complete(group["primary"], result=None, error=True)
            return
        self.searcher.on_trial_complete(group["primary"], result=averaged)  # exactly Ray's

    def get_state(self) -> dict:
        return {
            "repeat": self.repeat,
            "set_index": self._set_index,
            "groups": copy.deepcopy(self._groups),
            "group_of": dict(self._group_of),
            "searcher": self._inner_state(),
        }

    def set_state(self, state: dict) -> None:
        self.repeat = state["repeat"]
        self._set_index = state["set_index"]
        self._groups = copy.deepcopy(state["groups"])
        self._group_of = dict(state["group_of"])
        self._set_inner_state(state["searcher"])
