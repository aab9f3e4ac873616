"""A conformance check for searchers, shipped with the library (as ``optuna.testing`` is).

``check_searcher(make_searcher, param_space)`` drives a :class:`Searcher` the way the driver
loop does (through :class:`SearchGenerator`, several trials in flight, one failing), saves its
state halfway, restores it into a fresh searcher, and checks what the driver relies on:
every config is complete and inside the param space (a ``choice`` whose categories hold
parameters, a conditional space, gives one category with its parameters drawn), trial ids never repeat, and the
restored search continues to exactly ``n_trials``. A user's own Searcher can be held to the
same test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cloudpickle

from dasktune import space as sp
from dasktune.search._base import Searcher, Suggestion
from dasktune.search.search_generator import SearchGenerator

__all__ = ["check_searcher"]


def _value_at(config: Any, path: tuple) -> Any:
    for key in path:
        config = config[key]
    return config


def _fits(template: Any, value: Any) -> bool:
    """Whether ``value`` could be drawn from ``template`` (a domain, constant or container)."""
    if isinstance(template, sp.Categorical):
        return any(_fits(category, value) for category in template.categories)
    if isinstance(template, sp.Function):
        return True
    if isinstance(template, sp.Domain):
        return template.is_valid(value)
    if isinstance(template, dict) and not sp.is_grid(template):
        return isinstance(value, dict) and set(value) == set(template) and all(
            _fits(template[k], value[k]) for k in template)
    if isinstance(template, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(template) and all(
            _fits(t, v) for t, v in zip(template, value))
    return bool(template == value)


def _check_config(suggestion: Suggestion, param_space: dict) -> None:
    for path, domain in sp.leaves(param_space):
        value = _value_at(suggestion.config, path)
        if isinstance(domain, sp.Domain) and not isinstance(domain, sp.Function):
            # a choice of dicts holding parameters (a conditional space) gives one branch
            assert _fits(domain, value), (
                f"trial {suggestion.trial_id}: {sp.path_str(path)}={value!r} is outside "
                f"{domain.domain_str}"
            )
        elif not isinstance(domain, sp.Domain):
            assert value == domain, f"constant {sp.path_str(path)} changed to {value!r}"


def check_searcher(
    make_searcher: Callable[[], Searcher],
    param_space: dict,
    *,
    metric: str = "loss",
    mode: str = "min",
    n_trials: int = 8,
    in_flight: int = 2,
    objective: Callable[[dict], float] | None = None,
) -> list[Suggestion]:
    """Run the conformance check; raises AssertionError naming what broke.

    ``make_searcher`` builds a fresh, unconfigured searcher (it gets ``param_space`` through
    ``set_search_properties``). Returns every suggestion made, in order.
    """
    objective = objective or (lambda config: float(len(repr(config))))

    def generator(searcher: Searcher) -> SearchGenerator:
        gen = SearchGenerator(searcher, n_trials, experiment_uid="c0ffee00")
        gen.set_search_properties(metric, mode, param_space)
        # The check drives the searcher step by step: every ask answered on this thread
        # (a slow sampler would otherwise be asked on a thread of its own).
        gen.asks_inline = True
        return gen

    made: list[Suggestion] = []
    live: list[Suggestion] = []

    def step(gen: SearchGenerator, stop_after: int | None) -> None:
        failed_one = False
        while True:
            while len(live) < in_flight and (s := gen.next_trial()) is not None:
                _check_config(s, param_space)
                made.append(s)
                live.append(s)
            if not live or (stop_after is not None and len(made) >= stop_after):
                return
            done = live.pop(0)
            result = {metric: objective(done.config), "training_iteration": 1}
            gen.on_trial_result(done.trial_id, result)
            if not failed_one:
                gen.on_trial_complete(done.trial_id, None, error=True)
                failed_one = True
            else:
                gen.on_trial_complete(done.trial_id, dict(result, done=True))

    first = generator(make_searcher())
    step(first, stop_after=n_trials // 2)
    state = cloudpickle.loads(cloudpickle.dumps(first.get_state()))
    second = generator(make_searcher())
    second.set_state(state)
    step(second, stop_after=None)
    assert second.is_finished() or len(made) == n_trials, "the restored search did not finish"
    ids = [s.trial_id for s in made]
    assert len(set(ids)) == len(ids), f"trial ids repeat: {ids}"
    assert ids == [f"c0ffee00_{i:05d}" for i in range(len(ids))], f"trial ids skip: {ids}"
    assert len(made) <= n_trials, f"{len(made)} trials made, num_samples was {n_trials}"
    return made
