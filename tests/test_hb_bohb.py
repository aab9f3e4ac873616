"""HyperBandForBOHB: HyperBand's brackets (largest first) with the budget in the result, and
TuneBOHB learning from those budgets under the simulated driver."""

from __future__ import annotations

import importlib

import pytest

from dasktune.schedulers import HyperBandForBOHB, HyperBandScheduler, create_scheduler
from dasktune.schedulers.testing import SimpleContext, SimulatedRun
from dasktune.trial import PAUSED, TERMINATED, Trial


def make_trials(n: int) -> list[Trial]:
    return [Trial(trial_id=f"t{i:02d}", config={"i": i}) for i in range(n)]


def layout(scheduler: HyperBandScheduler, n: int) -> list[list[tuple[int, int] | None]]:
    ctx = SimpleContext(make_trials(n))
    for trial in ctx.trials:
        scheduler.on_trial_add(ctx, trial)
    return [[None if b is None else (b.n0, b.r0) for b in band]
            for band in scheduler._hyperbands]


@pytest.mark.parametrize("max_t,eta", [(9, 3), (50, 3), (10, 2), (81, 3), (100, 4), (20, 5)])
def test_bohb_brackets_are_hyperbands_largest_first(max_t, eta):
    """Each full band: the same brackets (trials, first milestone), in reverse order."""
    hb = layout(HyperBandScheduler(metric="m", mode="max", max_t=max_t, reduction_factor=eta), 300)
    bohb = layout(HyperBandForBOHB(metric="m", mode="max", max_t=max_t, reduction_factor=eta),
                  300)
    assert len(hb) == len(bohb) >= 2
    for hb_band, bohb_band in zip(hb[:-1], bohb[:-1]):  # the last band may be part-filled
        # a bracket too small for max_t is a None in both (where it comes in the order)
        assert bohb_band == hb_band[::-1]


def test_bohb_fills_the_largest_bracket_first_and_opens_a_second_band():
    sched = HyperBandForBOHB(metric="m", mode="max", max_t=9, reduction_factor=3)
    ctx = SimpleContext(make_trials(18))
    for trial in ctx.trials:
        sched.on_trial_add(ctx, trial)
    brackets = sched._hyperbands[0]
    assert [(b.n0, b.r0) for b in brackets] == [(9, 1), (5, 3), (3, 9)]
    assert brackets[0].all_trials == [f"t{i:02d}" for i in range(9)]
    assert len(sched._hyperbands) == 2 and sched._hyperbands[1][0].all_trials == ["t17"]
    assert create_scheduler("hb_bohb", metric="m", mode="max").__class__ is HyperBandForBOHB
    assert importlib.import_module("dasktune.schedulers.hb_bohb").HyperBandForBOHB \
        is HyperBandForBOHB


def test_budget_is_set_at_each_milestone_and_the_trial_paused_there():
    trials = make_trials(17)
    sched = HyperBandForBOHB(metric="score", mode="max", max_t=9, reduction_factor=3)
    infos: dict[str, list] = {}

    def metrics(trial, it):
        return {"score": trial.config["i"] + it / 100}

    class Recording(HyperBandForBOHB):
        def on_trial_result(self, ctx, trial, result):
            decision = super().on_trial_result(ctx, trial, result)
            infos.setdefault(trial.trial_id, []).append(
                (result["training_iteration"], result["hyperband_info"].get("budget"), decision))
            return decision

    sched = Recording(metric="score", mode="max", max_t=9, reduction_factor=3)
    sim = SimulatedRun(sched, trials, metrics, slots=4, max_iter=100).run()
    assert all(t.status == TERMINATED for t in trials)
    milestones = {"t00": [1, 3, 9], "t09": [3, 9], "t14": [9]}  # one trial of each bracket
    for tid, expected in milestones.items():
        budgets = [(it, b) for it, b, _ in infos[tid] if b is not None]
        assert all(it == b for it, b in budgets), budgets
        assert [b for _, b in budgets] == expected[:len(budgets)]
    # the best of the largest bracket reaches every milestone, pausing at the first two
    # unless it was the last to arrive
    assert [b for _, b, _ in infos["t08"] if b is not None] == [1, 3, 9]
    for tid, rows in infos.items():
        for it, budget, decision in rows:
            if budget is None:
                assert decision == "CONTINUE", (tid, it)
    assert sim.stopped(), "halvings stopped the weaker trials"


def test_tune_bohb_learns_per_budget_and_does_not_count_paused_trials():
    pytest.importorskip("hpbandster")
    from dasktune import space as sp
    from dasktune.search.bohb import TuneBOHB

    searcher = TuneBOHB(seed=0, max_concurrent=2)
    assert searcher.set_search_properties("score", "max", {"x": sp.uniform(0, 1),
                                                           "k": sp.choice(["a", "b"])})
    trials: list[Trial] = []

    class Tee(HyperBandForBOHB):
        """The driver's order: the scheduler judges a result, then the searcher sees it."""

        def on_trial_result(self, ctx, trial, result):
            decision = super().on_trial_result(ctx, trial, result)
            searcher.on_trial_result(trial.trial_id, result)
            return decision

        def on_trial_complete(self, ctx, trial, result):
            super().on_trial_complete(ctx, trial, result)
            searcher.on_trial_complete(trial.trial_id, result)

    sched = Tee(metric="score", mode="max", max_t=9, reduction_factor=3)
    sim = SimulatedRun(sched, [], lambda t, it: {"score": t.config["x"] * it}, slots=2,
                       add_trials_upfront=False)
    # add trials as the searcher allows (two running, paused ones not counted)
    while len(trials) < 17:
        config = searcher.suggest(f"t{len(trials):02d}")
        if config is None:
            assert sum(t.status == PAUSED for t in trials) < len(trials)
            sim.run(max_rounds=1, until_end=False)
            continue
        trial = Trial(trial_id=f"t{len(trials):02d}", config=config)
        trials.append(trial)
        sim.add(trial)
        # with both running trials paused at a milestone, a third may start
        assert len(searcher._live) - len(searcher.paused) <= 2
    sim.run()
    assert all(t.status == TERMINATED for t in trials)
    assert sorted(searcher._opt.configs) == [1, 3, 9]  # results came in at each budget
    assert searcher._opt.kde_models  # ... enough of them for BOHB to build its model
    assert not searcher._live and not searcher.paused
