"""InFlightTPESampler: Optuna's TPE with more EI candidates while trials are in flight."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.samplers import TPESampler

from dasktune.search.optuna import InFlightTPESampler

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTS = {"x": FloatDistribution(-5, 5), "y": FloatDistribution(-5, 5)}


def _f(params: dict) -> float:
    return (params["x"] - 1) ** 2 + (params["y"] + 2) ** 2


def ask_tell(sampler: optuna.samplers.BaseSampler, n: int, in_flight: int) -> list[dict]:
    """``n`` trials with ``in_flight`` asked and not told at each ask (oldest told first)."""
    study = optuna.create_study(sampler=sampler)
    live: list[optuna.Trial] = []
    asked = 0
    while asked < n or live:
        while len(live) < in_flight and asked < n:
            live.append(study.ask(DISTS))
            asked += 1
        trial = live.pop(0)
        study.tell(trial, _f(trial.params))
    return [t.params for t in study.trials]


def test_one_trial_in_flight_is_exactly_optunas_tpe():
    # past TPE's 10 random startup trials, so the model's suggestions are compared too
    assert ask_tell(InFlightTPESampler(seed=7), 25, 1) == ask_tell(TPESampler(seed=7), 25, 1)


def test_max_scale_one_is_exactly_optunas_tpe_at_any_concurrency():
    assert (ask_tell(InFlightTPESampler(seed=3, max_scale=1), 25, 4)
            == ask_tell(TPESampler(seed=3), 25, 4))


def test_candidates_grow_with_the_trials_in_flight(monkeypatch):
    used: dict[int, int] = {}
    sample_relative = TPESampler.sample_relative

    def spy(self, study, trial, search_space):
        used[trial.number] = self._n_ei_candidates
        return sample_relative(self, study, trial, search_space)

    monkeypatch.setattr(TPESampler, "sample_relative", spy)
    ask_tell(InFlightTPESampler(seed=0, n_ei_candidates=10, max_scale=3), 20, 4)
    # trial k is asked with min(k, 3) others running: 1, 2, 3, then 4 capped at 3
    assert [used[n] for n in range(5)] == [10, 20, 30, 30, 30]
    assert set(used[n] for n in range(5, 20)) == {30}


def test_seeded_default_is_reproducible_and_better_than_random_at_four_in_flight():
    runs = [ask_tell(InFlightTPESampler(seed=s), 60, 4) for s in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    best = min(_f(p) for p in runs[0])
    random_best = min(_f(p) for p in ask_tell(optuna.samplers.RandomSampler(seed=0), 60, 4))
    assert best < random_best


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="max_scale"):
        InFlightTPESampler(max_scale=0)
    with pytest.raises(TypeError):
        InFlightTPESampler(not_a_tpe_argument=1)
