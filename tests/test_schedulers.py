"""Trial schedulers against known curves, driven by the simulated driver (no Dask)."""

from __future__ import annotations

import importlib
import json
import math
import random

import pytest

import dasktune as tune
from dasktune.policy_log import PBTPolicyLogger
from dasktune.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    Exploit,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    SchedulerContext,
    TrialScheduler,
    create_scheduler,
)
from dasktune.schedulers._pbt_explore import explore
from dasktune.schedulers.testing import SimpleContext, SimulatedRun
from dasktune.storage import ExperimentStorage
from dasktune.trial import PAUSED, PENDING, RUNNING, TERMINATED, Trial


def make_trials(n: int, config: dict | None = None) -> list[Trial]:
    return [Trial(trial_id=f"t{i:02d}", config=dict(config or {"i": i})) for i in range(n)]


def constant(scores: dict[str, float], key: str = "score"):
    return lambda trial, it: {key: scores[trial.trial_id]}


# ----------------------------------------------------------------------------- contract
def test_exports_and_create_scheduler():
    assert ASHAScheduler is AsyncHyperBandScheduler
    assert isinstance(create_scheduler("async_hyperband", metric="m", mode="max"),
                      AsyncHyperBandScheduler)
    assert isinstance(create_scheduler("pbt", metric="m", mode="max",
                                       hyperparam_mutations={"a": [1, 2]}),
                      PopulationBasedTraining)
    assert isinstance(create_scheduler("fifo"), FIFOScheduler)
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        create_scheduler("nope")
    assert type(create_scheduler("hb_bohb")).__name__ == "HyperBandForBOHB"
    assert isinstance(SimpleContext(), SchedulerContext)
    assert TrialScheduler.CONTINUE == "CONTINUE" and TrialScheduler.NOOP == "NOOP"


@pytest.mark.parametrize(("module", "names"), [
    ("trial_scheduler", ["TrialScheduler", "FIFOScheduler"]),
    ("async_hyperband", ["AsyncHyperBandScheduler", "ASHAScheduler"]),
    ("hyperband", ["HyperBandScheduler"]),
    ("median_stopping_rule", ["MedianStoppingRule"]),
    ("pbt", ["PopulationBasedTraining", "PopulationBasedTrainingReplay"]),
    ("pb2", ["PB2"]),
    ("resource_changing_scheduler", ["ResourceChangingScheduler"]),
])
def test_rays_submodule_paths(module, names):
    """``from ray.tune.schedulers.pbt import ...`` translates to ``dasktune.schedulers.pbt``."""
    mod = importlib.import_module(f"dasktune.schedulers.{module}")
    package = importlib.import_module("dasktune.schedulers")
    for name in names:
        assert getattr(mod, name) is getattr(package, name)


@pytest.mark.parametrize("cls", [AsyncHyperBandScheduler, HyperBandScheduler,
                                 MedianStoppingRule])
def test_mode_validation_and_search_properties(cls):
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        cls(metric="m", mode="maximize")
    s = cls()
    with pytest.raises(ValueError, match="mode must be"):
        s.set_search_properties("m", "up")
    assert s.set_search_properties("m", "max")
    assert (s.metric, s.mode) == ("m", "max")
    # Ray's rule: a metric or mode the scheduler has is never given again, even the same.
    assert not s.set_search_properties("m", "max")
    assert not s.set_search_properties("m", None)
    assert not s.set_search_properties(None, "max")
    assert s.set_search_properties(None, None)
    assert (s.metric, s.mode) == ("m", "max")
    half = cls(metric="m")
    assert half.set_search_properties(None, "min") and (half.metric, half.mode) == ("m", "min")


def test_metric_needed_and_missing_keys_named():
    ctx = SimpleContext(make_trials(1))
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        ASHAScheduler().on_trial_add(ctx, ctx.trials[0])
    for sched in (ASHAScheduler(metric="loss", mode="min"),
                  HyperBandScheduler(metric="loss", mode="min"),
                  MedianStoppingRule(metric="loss", mode="min", time_attr="training_iteration"),
                  PopulationBasedTraining(metric="loss", mode="min",
                                          time_attr="training_iteration",
                                          hyperparam_mutations={"i": [0, 1]})):
        trial = make_trials(1)[0]
        sched.on_trial_add(ctx, trial)
        # The trainable's own keys first, then the automatic ones.
        with pytest.raises(ValueError, match=r"without 'loss' \(reported keys: \['acc'\], "
                                             r"and the automatic training_iteration\)"):
            sched.on_trial_result(ctx, trial, {"acc": 1.0, "training_iteration": 1})
        with pytest.raises(ValueError, match="without 'training_iteration'"):
            sched.on_trial_result(ctx, trial, {"loss": 1.0})


def test_fifo_runs_everything_in_order():
    trials = make_trials(3)
    sim = SimulatedRun(FIFOScheduler(), trials, constant({"t00": 1, "t01": 2, "t02": 3}),
                       max_iter=4).run()
    assert sim.starts() == ["t00", "t01", "t02"]
    assert sim.iterations_run == 12 and not sim.stopped()


# ----------------------------------------------------------------------------- ASHA
@pytest.mark.parametrize("mode", ["max", "min"])
def test_asha_rungs_stop_and_promote_known_curves(mode):
    sign = 1 if mode == "max" else -1
    trials = make_trials(4)
    scores = {"t00": 5, "t01": 1, "t02": 9, "t03": 3}
    sched = ASHAScheduler(metric="score", mode=mode, max_t=4, grace_period=1,
                          reduction_factor=2)
    sim = SimulatedRun(sched, trials, lambda t, it: {"score": sign * scores[t.trial_id]},
                       max_iter=10).run()
    # Rungs at 1, 2, 4. t01 (1) is below the median of {5} at rung 1; t03 (3) below the
    # median of {5, 1, 9}. t00 and t02 pass every rung and are stopped at max_t.
    assert sim.position == {"t00": 4, "t01": 1, "t02": 4, "t03": 1}
    assert sim.decisions("t01") == [(1, "STOP")]
    assert sim.decisions("t03") == [(1, "STOP")]
    assert sim.decisions("t00") == [(1, "CONTINUE"), (2, "CONTINUE"), (3, "CONTINUE"),
                                    (4, "STOP")]
    assert sim.decisions("t02")[-1] == (4, "STOP")
    assert sim.iterations_run == 4 + 1 + 4 + 1
    assert [m for m, _ in sched._brackets[0].rungs] == [4, 2, 1]


def test_asha_spends_a_fraction_of_fifo_and_keeps_the_best():
    n, max_t = 32, 100
    rng = random.Random(0)
    quality = list(range(n))
    rng.shuffle(quality)
    trials = make_trials(n)
    q = {t.trial_id: quality[i] for i, t in enumerate(trials)}

    def curve(trial, it):  # saturating curves that never cross: final rank is q's rank
        return {"acc": (q[trial.trial_id] + 1) * (1 - math.exp(-it / 10))}

    fifo = SimulatedRun(FIFOScheduler(), make_trials(n), curve, slots=4, max_iter=max_t).run()
    asha = SimulatedRun(ASHAScheduler(metric="acc", mode="max", max_t=max_t), trials, curve,
                        slots=4, max_iter=max_t).run()
    assert fifo.iterations_run == n * max_t
    assert asha.iterations_run <= 0.35 * fifo.iterations_run
    best = max(q, key=q.get)
    assert asha.position[best] == max_t  # the best trial is never stopped early
    assert len(asha.stopped()) >= n // 2


def test_asha_brackets_and_state_round_trip(tmp_path):
    sched = ASHAScheduler(metric="m", mode="max", max_t=16, grace_period=1, reduction_factor=2,
                          brackets=3)
    assert [len(b.rungs) for b in sched._brackets] == [5, 4, 3]
    ctx = SimpleContext(make_trials(10))
    for t in ctx.trials:
        sched.on_trial_add(ctx, t)
    # Each trial's bracket is drawn from its id: stable, and more rungs are likelier.
    brackets = dict(sched._trial_bracket)
    for t in ctx.trials[:6]:
        sched.on_trial_result(ctx, t, {"training_iteration": 1, "m": float(t.trial_id[1:])})
    sched.save(str(tmp_path / "s.pkl"))
    fresh = ASHAScheduler(metric="m", mode="max", max_t=16, grace_period=1, reduction_factor=2,
                          brackets=3)
    fresh.restore(str(tmp_path / "s.pkl"))
    assert fresh._trial_bracket == brackets
    for t in ctx.trials[6:]:
        r = {"training_iteration": 1, "m": 3.5}
        assert fresh.on_trial_result(ctx, t, r) == sched.on_trial_result(ctx, t, r)
    assert fresh.get_state()["_brackets"][0].rungs == sched.get_state()["_brackets"][0].rungs


# ----------------------------------------------------------------------------- HyperBand
def test_hyperband_bracket_layout():
    hb = HyperBandScheduler(metric="m", mode="max", max_t=9, reduction_factor=3)
    ctx = SimpleContext(make_trials(18))
    for t in ctx.trials:
        hb.on_trial_add(ctx, t)
    band0 = hb._hyperbands[0]
    assert [(b.n0, b.r0) for b in band0] == [(3, 9), (5, 3), (9, 1)]
    assert len(hb._hyperbands) == 2  # the 18th trial opens a second band
    assert hb._trial_info["t17"] == (1, 0)


def test_hyperband_skips_brackets_too_small_for_max_t():
    hb = HyperBandScheduler(metric="m", mode="max", max_t=50, reduction_factor=3)
    ctx = SimpleContext(make_trials(63))
    for t in ctx.trials:
        hb.on_trial_add(ctx, t)
    assert [None if b is None else (b.n0, b.r0) for b in hb._hyperbands[0]] == [
        (5, 50), (8, 16), (15, 5), (34, 1), None]
    assert hb._trial_info["t62"] == (1, 0)  # 5 + 8 + 15 + 34 = 62 fill band 0


def test_hyperband_pauses_at_milestone_and_promotes_the_best():
    trials = make_trials(8)
    # t00-t02 fill bracket s=0 (3 trials straight to 9); t03-t07 bracket s=1 (5 trials to 3,
    # the best ceil(5/3) = 2 on to 9).
    scores = {"t00": 0, "t01": 0, "t02": 0, "t03": 4, "t04": 8, "t05": 1, "t06": 6, "t07": 2}
    hb = HyperBandScheduler(metric="score", mode="max", max_t=9, reduction_factor=3)
    sim = SimulatedRun(hb, trials, constant(scores), slots=2, max_iter=100).run()
    for tid in ("t00", "t01", "t02", "t04", "t06"):
        assert sim.position[tid] == 9, tid
        assert sim.decisions(tid)[-1] == (9, "STOP")
    for tid in ("t03", "t05", "t07"):
        assert sim.position[tid] == 3, tid
    # Everyone in bracket s=1 but the last to arrive pauses at the milestone 3.
    paused = [tid for tid in scores if (3, "PAUSE") in sim.decisions(tid)]
    assert len(paused) == 4 and set(paused) < {"t03", "t04", "t05", "t06", "t07"}
    # Promoted trials resumed from their checkpoint (iteration 4 next, not 1).
    assert [it for it, _ in sim.decisions("t04")] == list(range(1, 10))
    assert {"t03", "t05", "t07"} <= set(sim.stopped())
    assert all(t.status == TERMINATED for t in trials)
    assert sim.iterations_run == 3 * 9 + 5 * 3 + 2 * 6


def test_hyperband_without_trials_to_stop_still_ends():
    trials = make_trials(8)
    scores = {"t00": 0, "t01": 0, "t02": 0, "t03": 4, "t04": 8, "t05": 1, "t06": 6, "t07": 2}
    hb = HyperBandScheduler(metric="score", mode="max", max_t=9, reduction_factor=3)
    sim = SimulatedRun(hb, trials, constant(scores), slots=2, use_trials_to_stop=False).run()
    assert all(t.status == TERMINATED for t in trials)
    for tid in ("t04", "t06"):
        assert sim.position[tid] == 9
    for tid in ("t03", "t05", "t07"):  # cut trials are stopped at their first result back
        assert sim.position[tid] <= 4


def test_hyperband_choose_trial_to_run_order():
    hb = HyperBandScheduler(metric="score", mode="max", max_t=9, reduction_factor=3)
    trials = make_trials(9)
    ctx = SimpleContext(trials)
    for t in trials:
        hb.on_trial_add(ctx, t)
    # All brackets are 0% done: the first bracket's trials come first, in order.
    assert hb.choose_trial_to_run(ctx).trial_id == "t00"
    trials[0].set_status(RUNNING)
    assert hb.choose_trial_to_run(ctx).trial_id == "t01"
    # Progress in bracket s=0 makes bracket s=1 (0% done) the least complete.
    hb.on_trial_result(ctx, trials[0], {"training_iteration": 5, "score": 1})
    assert hb.choose_trial_to_run(ctx).trial_id == "t03"
    # Paused trials not yet promoted are never chosen.
    for t in trials[3:8]:
        t.set_status(RUNNING)
    for t, score in zip(trials[3:7], [4, 1, 2, 3]):
        assert hb.on_trial_result(ctx, t, {"training_iteration": 3, "score": score}) == "PAUSE"
        t.set_status(PAUSED)
    assert hb.choose_trial_to_run(ctx).trial_id == "t08"  # bracket s=2, still 0% done
    for t in (trials[1], trials[2], trials[8]):
        t.set_status(RUNNING)
    assert hb.choose_trial_to_run(ctx) is None
    # The last arrival triggers the halving: t07 (best) continues, t03 (next best) promoted.
    assert hb.on_trial_result(ctx, trials[7], {"training_iteration": 3, "score": 9}) \
        == "CONTINUE"
    chosen = hb.choose_trial_to_run(ctx)
    assert chosen.status == PAUSED and chosen.trial_id == "t03"
    cut = {t.trial_id for t in hb.trials_to_stop(ctx)}
    assert cut == {"t04", "t05", "t06"}
    assert hb.trials_to_stop(ctx) == []  # each returned once


def test_hyperband_state_round_trip_continues_identically(tmp_path):
    scores = {f"t{i:02d}": (i * 7) % 11 for i in range(12)}

    def build(trials):
        return SimulatedRun(HyperBandScheduler(metric="score", mode="max", max_t=9),
                            trials, constant(scores), slots=3)

    full = build(make_trials(12)).run()
    half = build(make_trials(12)).run(max_rounds=6, until_end=False)
    half.scheduler.save(str(tmp_path / "hb.pkl"))
    restored = [Trial.from_state(t.to_state()) for t in half.trials]
    for t in restored:
        if t.status == RUNNING:  # the driver's shutdown requeues running trials
            t.set_status(PENDING)
    sched = HyperBandScheduler(metric="score", mode="max", max_t=9)
    sched.restore(str(tmp_path / "hb.pkl"))
    rest = SimulatedRun(sched, restored, constant(scores), slots=3)
    rest.run()
    assert {t.trial_id: rest.position.get(t.trial_id, 0) or half.position[t.trial_id]
            for t in restored} == full.position


# ----------------------------------------------------------------------------- median
def test_median_stopping_rule_stops_below_median():
    trials = make_trials(4)
    scores = {"t00": 5, "t01": 6, "t02": 1, "t03": 7}
    rule = MedianStoppingRule(time_attr="training_iteration", metric="score", mode="max",
                              grace_period=2, min_samples_required=2)
    sim = SimulatedRun(rule, trials, constant(scores), slots=4, max_iter=5).run()
    # At t=2, t02's best (1) is below the median of t00 and t01's means (5.5).
    assert sim.stopped() == ["t02"]
    assert sim.decisions("t02") == [(1, "CONTINUE"), (2, "STOP")]
    assert sim.position["t03"] == 5


def test_median_stopping_soft_stop_pauses_then_resumes_last():
    trials = make_trials(4)
    scores = {"t00": 5, "t01": 6, "t02": 1, "t03": 7}
    rule = MedianStoppingRule(time_attr="training_iteration", metric="score", mode="max",
                              grace_period=2, min_samples_required=2, hard_stop=False)
    sim = SimulatedRun(rule, trials, constant(scores), slots=4, max_iter=5).run()
    assert (2, "PAUSE") in sim.decisions("t02")
    assert sim.position["t02"] == 5 and not sim.stopped()


def test_median_stopping_pauses_for_waiting_trials_with_few_samples():
    trials = make_trials(2)
    rule = MedianStoppingRule(time_attr="training_iteration", metric="score", mode="min",
                              grace_period=1, min_samples_required=3)
    ctx = SimpleContext(trials)
    for t in trials:
        rule.on_trial_add(ctx, t)
    trials[0].set_status(RUNNING)
    assert rule.on_trial_result(ctx, trials[0], {"training_iteration": 1, "score": 1}) == "PAUSE"
    trials[1].set_status(RUNNING)
    assert rule.on_trial_result(ctx, trials[1], {"training_iteration": 1, "score": 1}) \
        == "CONTINUE"


# ----------------------------------------------------------------------------- PBT
MUTATIONS = {"lr": [0.001, 0.01, 0.1], "opt": {"beta": [0.8, 0.9, 0.99]}}


def pbt_trials(n=4, checkpoint=True):
    trials = [Trial(trial_id=f"t{i}", config={"lr": 0.01, "opt": {"beta": 0.9}, "x": i})
              for i in range(n)]
    for t in trials:
        t.status = RUNNING
        t.checkpoint = f"ckpt/{t.trial_id}" if checkpoint else None
    return trials


def pbt(**kw):
    args = dict(time_attr="training_iteration", metric="score", mode="max",
                perturbation_interval=2, hyperparam_mutations=MUTATIONS, seed=0)
    args.update(kw)
    return PopulationBasedTraining(**args)


def test_pbt_exploit_clones_a_top_quantile_donor():
    sched = pbt()
    trials = pbt_trials(8)
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)
    for rank, t in enumerate(trials):  # each new reporter is the best so far: no exploit
        assert sched.on_trial_result(ctx, t, {"training_iteration": 2, "score": float(rank)}) \
            == "CONTINUE"
    decisions = {}
    for rank, t in reversed(list(enumerate(trials))):  # worst reports last
        decisions[t.trial_id] = sched.on_trial_result(
            ctx, t, {"training_iteration": 4, "score": float(rank)})
    # 8 trials, quantile 0.25: t0 and t1 are the bottom, t6 and t7 the top.
    for tid in ("t0", "t1"):
        d = decisions[tid]
        assert isinstance(d, Exploit), (tid, d)
        assert d.donor_trial_id in ("t6", "t7")
        assert d.checkpoint == f"ckpt/{d.donor_trial_id}"
        assert d.config["x"] == int(d.donor_trial_id[1:])  # the donor's config, explored
        assert d.config["lr"] in MUTATIONS["lr"]
        assert d.config["opt"]["beta"] in MUTATIONS["opt"]["beta"]
    assert all(decisions[f"t{i}"] == "CONTINUE" for i in range(2, 8))
    # Not again until another perturbation_interval has passed.
    assert sched.on_trial_result(ctx, trials[2], {"training_iteration": 5, "score": -5}) \
        == "CONTINUE"
    assert len(sched.perturbations) == 2


@pytest.mark.parametrize("log_config", [True, False])
def test_pbt_log_config_writes_rays_policy_files(tmp_path, log_config):
    storage = ExperimentStorage(str(tmp_path), "exp")
    sched = pbt(log_config=log_config)
    trials = pbt_trials(4)
    for i, t in enumerate(trials):
        t.experiment_tag = f"{i}_lr=0.01"
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)

    # The scheduler writes nothing: its exploits carry the lines the driver's policy-log
    # callback writes, as in a run.
    policy_log = PBTPolicyLogger()
    policy_log.setup(storage=storage)

    def report(t: Trial, it: int, score: float):
        t.last_result = {"training_iteration": it, "score": score}
        decision = sched.on_trial_result(ctx, t, dict(t.last_result))
        if isinstance(decision, Exploit):
            policy_log.on_trial_exploit(iteration=0, trials=trials, trial=t, exploit=decision)
        return decision

    for rank, t in enumerate(trials):  # each new reporter is the best so far: no exploit
        assert report(t, 2, float(rank)) == "CONTINUE"
    for rank, t in reversed(list(enumerate(trials))):  # t0, the worst, reports last
        first = report(t, 4, float(rank))
    assert isinstance(first, Exploit) and first.donor_trial_id == "t3"
    folder = tmp_path / "exp"
    if not log_config:
        assert not list(folder.glob("pbt_*.txt")) and not sched.perturbations
        return
    policy = ["0_lr=0.01", "3_lr=0.01", 4, 4, trials[3].config, first.config]
    assert [json.loads(x) for x in (folder / "pbt_global.txt").read_text().splitlines()] \
        == [policy]
    assert json.loads((folder / "pbt_policy_t0.txt").read_text()) == policy
    # t3 exploits t0 later: t3's policy file takes over t0's history, then adds its step.
    trials[0].config = first.config
    second = None
    for t, score in ((trials[0], 9.0), (trials[1], 5.0), (trials[2], 6.0), (trials[3], 0.0)):
        second = report(t, 6, score)
    assert isinstance(second, Exploit) and second.donor_trial_id == "t0"
    t3_lines = [json.loads(x) for x in (folder / "pbt_policy_t3.txt").read_text().splitlines()]
    assert t3_lines[0] == policy and t3_lines[1][:4] == ["3_lr=0.01", "0_lr=0.01", 6, 6]
    assert len((folder / "pbt_global.txt").read_text().splitlines()) == 2


def test_pbt_explore_stays_within_mutations():
    from dasktune import space

    mutations = {"lr": space.uniform(0.0, 1.0), "bs": [16, 32, 64], "n": lambda: 7,
                 "opt": {"beta": [0.8, 0.9]}}
    seen_ops = set()
    for seed in range(60):
        donor_cfg = {"lr": 0.5, "bs": 32, "n": 10, "opt": {"beta": 0.9}}
        new, ops = explore(donor_cfg, mutations, 0.5, (1.2, 0.8), None, random.Random(seed))
        assert new["lr"] in (0.6, 0.4) or 0.0 <= new["lr"] <= 1.0
        assert new["bs"] in (16, 32, 64)
        assert new["n"] in (7, 12, 8) and isinstance(new["n"], int)
        assert new["opt"]["beta"] in (0.8, 0.9)
        seen_ops.update([ops["lr"], ops["bs"]])
        assert donor_cfg == {"lr": 0.5, "bs": 32, "n": 10, "opt": {"beta": 0.9}}  # untouched
    assert {"resample", "* 1.2", "* 0.8", "shift left", "shift right"} <= seen_ops


def test_pbt_custom_explore_fn():
    sched = pbt(hyperparam_mutations=None, custom_explore_fn=lambda c: {**c, "lr": 42})
    trials = pbt_trials(4)
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)
    for rank, t in reversed(list(enumerate(trials))):
        d = sched.on_trial_result(ctx, t, {"training_iteration": 2, "score": float(rank)})
    assert isinstance(d, Exploit) and d.config["lr"] == 42


def test_pbt_errors():
    with pytest.raises(ValueError, match="hyperparam_mutations or custom_explore_fn"):
        PopulationBasedTraining(metric="m", mode="max")
    with pytest.raises(ValueError, match="hyperparam_mutations or custom_explore_fn"):
        PopulationBasedTraining(metric="m", mode="max", hyperparam_mutations={})
    with pytest.raises(TypeError, match=r"hyperparam_mutations\['lr'\] must be"):
        PopulationBasedTraining(metric="m", mode="max", hyperparam_mutations={"lr": 0.1})
    with pytest.raises(ValueError, match="quantile_fraction"):
        pbt(quantile_fraction=0.7)
    with pytest.raises(ValueError, match="mode must be"):
        pbt(mode="best")
    sched = pbt(hyperparam_mutations={"lr": [0.1], "wd": [0.1, 0.2], "opt": {"eps": [1]}})
    with pytest.raises(ValueError, match=r"\['wd', 'opt/eps'\] not in the config of trial t0"):
        sched.on_trial_add(SimpleContext(), pbt_trials(1)[0])


def test_pbt_donor_without_checkpoint_is_named():
    sched = pbt()
    trials = pbt_trials(4, checkpoint=False)
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)
    assert sched.on_trial_result(ctx, trials[3], {"training_iteration": 2, "score": 3.0}) \
        == "CONTINUE"
    # The first exploit: t2 (worse) would clone t3, which has no checkpoint.
    with pytest.raises(ValueError, match="trial t3 was chosen to be cloned by trial t2 but has "
                                         "no checkpoint"):
        sched.on_trial_result(ctx, trials[2], {"training_iteration": 2, "score": 0.0})


def test_pbt_simulated_population_converges_and_round_trips(tmp_path):
    lrs = [0.001, 0.01, 0.1, 1.0]
    trials = [Trial(trial_id=f"t{i}", config={"lr": lr}) for i, lr in enumerate(lrs)]

    def metrics(trial, it):  # the best lr is 0.1; progress accrues with iterations
        return {"score": it * (1 - abs(math.log10(trial.config["lr"]) + 1) / 3)}

    sched = pbt(hyperparam_mutations={"lr": lrs}, perturbation_interval=3)
    sim = SimulatedRun(sched, trials, metrics, slots=4, max_iter=30).run()
    exploits = [e for e in sim.events if e[0] == "result" and isinstance(e[3], Exploit)]
    assert exploits
    for _, tid, _, d in exploits:
        assert d.donor_trial_id != tid
    # Exploited trials restart from the donor's checkpoint (its iteration, not 0).
    assert sum(1 for t in trials if sim.position[t.trial_id] == 30) == 4
    assert sum(t.config["lr"] in (0.1, 0.01, 1.0) for t in trials) >= 3
    state = sched.get_state()
    sched.save(str(tmp_path / "pbt.pkl"))
    fresh = pbt(hyperparam_mutations={"lr": lrs}, perturbation_interval=3)
    fresh.restore(str(tmp_path / "pbt.pkl"))
    assert fresh.get_state() == state
    assert fresh._rng.random() == sched._rng.random()


@pytest.mark.parametrize("members,slots", [(4, 2), (4, 3), (5, 3)])
def test_pbt_small_populations_on_few_slots_always_finish(members, slots):
    """Ray's pbt_example shape (members start alike, noisy progress, 5-iteration
    perturbations and checkpoints) with few members, where the top and bottom quantiles
    are one or two trials. A clone waiting to restart used to take its donor's score, so
    it looked like the top trial while it could not run (it was behind) and others kept
    cloning its old checkpoint: some seeds never finished. Every seed must finish, with
    about one exploit per member and perturbation interval at most."""
    for seed in range(20):
        rng = random.Random(seed)
        trials = [Trial(trial_id=f"t{i}", config={"lr": 0.0001}) for i in range(members)]

        def metrics(trial, it, rng=rng):
            return {"acc": it * min(trial.config["lr"], 0.01) * 100 + 10 * rng.gauss(0, 1)}

        sched = PopulationBasedTraining(
            time_attr="training_iteration", metric="acc", mode="max", seed=seed,
            perturbation_interval=5, hyperparam_mutations={"lr": tune.uniform(0.0001, 0.02)})
        sim = SimulatedRun(sched, trials, metrics, slots=slots, max_iter=100,
                           checkpoint_every=5).run(max_rounds=5_000)
        assert all(sim.position[t.trial_id] == 100 for t in trials), seed
        exploits = sum(isinstance(e[3], Exploit) for e in sim.events if e[0] == "result")
        assert exploits <= members * 100 // 5, (seed, exploits)


def test_pbt_synch_waits_for_everyone():
    sched = pbt(synch=True)
    trials = pbt_trials(4)
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)
    out = {}
    for rank, t in enumerate(trials[:3]):
        out[t.trial_id] = sched.on_trial_result(ctx, t, {"training_iteration": 2,
                                                         "score": float(rank + 1)})
        t.status = PAUSED
    assert set(out.values()) == {"PAUSE"}
    assert sched.choose_trial_to_run(ctx) is None  # all paused ones are at the sync point
    # The last one (the worst) arrives: it exploits now.
    d = sched.on_trial_result(ctx, trials[3], {"training_iteration": 2, "score": 0.0})
    assert isinstance(d, Exploit) and d.donor_trial_id == "t2"
    assert sched.choose_trial_to_run(ctx) is not None
