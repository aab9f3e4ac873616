"""The simulated executor: the real driver loop on a virtual clock.

Deterministic runs, agreement with the real (Dask) executor on ASHA and PBT decisions,
no report lost or reordered under load, worker loss at scale, and driver memory that does
not grow with the number of reports.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from collections import defaultdict
from collections.abc import Sequence

import pytest

import dasktune as tune
from dasktune.callback import Callback
from dasktune.config import CheckpointConfig, RunConfig, TuneConfig
from dasktune.execution.sim_attempt import EPOCH
from dasktune.schedulers import ASHAScheduler, PopulationBasedTraining
from dasktune.simulator import SimulatedExecutor, run_simulated

# ----------------------------------------------------------------- models


def asha_model(config, trial_id):
    """8 iterations; the score curve depends only on the config (not the trial id)."""
    return [(0.0, {"score": config["q"] * (i + 1) / 8}) for i in range(8)]


def pbt_model(config, trial_id):
    """6 iterations of 1 virtual second, each but the last checkpointed (PBT clones
    checkpoints; a clone of a donor's final one would have nothing left to run)."""
    return [(1.0, {"score": config["q"] + 0.01 * i}, i < 5) for i in range(6)]


def varied_model(config, trial_id):
    """1-20 iterations of 0.5-1.5 virtual seconds, from the config."""
    n = 1 + int(config["x"] * 19.999)
    return [(0.5 + config["x"], {"loss": config["x"] / (i + 1)}) for i in range(n)]


class LazySteps(Sequence):
    """``n`` iterations made on demand: the model itself holds no memory per report."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (1.0, {"loss": 1.0 / (i + 1)})


class Recorder(Callback):
    """Every result each trial reported, in the order the driver saw them."""

    def __init__(self):
        self.iterations: dict[str, list[int]] = defaultdict(list)
        self.configs: dict[str, dict] = {}
        # Per result: how many of the trial's attempts had ended in an exploit by then.
        self.exploits: dict[str, list[int]] = defaultdict(list)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.iterations[trial.trial_id].append(result["training_iteration"])
        self.configs[trial.trial_id] = dict(trial.config)
        self.exploits[trial.trial_id].append(
            sum(p.outcome == "exploited" for p in trial.placements))


def outcomes(results):
    """Per trial, in creation order: config, status, last iteration, last score."""
    return [(r.config, r.metrics.get("training_iteration"), r.metrics.get("score"),
             r.metrics.get("loss")) for r in results]


def attempts(results):
    """Per trial, in creation order: how each of its attempts ended."""
    return [[p.outcome for p in t.placements] for t in results._trials]


def checkpoint_iterations(results):
    """Per trial, in creation order: the iteration of each checkpoint it registered."""
    return [[c["iteration"] for c in t.checkpoints] for t in results._trials]


def real_trainable(config, model):
    """Runs ``model``'s iterations for real, checkpointing where it says so."""
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "i.json")) as f:
                start = json.load(f)["i"]
    steps = model(config, tune.get_context().get_trial_id())
    for i in range(start, len(steps)):
        step = steps[i]
        if len(step) > 2 and step[2]:
            d = os.path.join(tune.get_context().get_trial_dir(), f"tmp_{i}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "i.json"), "w") as f:
                json.dump({"i": i + 1}, f)
            tune.report(step[1], checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(step[1])


def run_real(model, storage_path, param_space, tc, rc_kw=None):
    def trainable(config):
        real_trainable(config, model)

    rc = RunConfig(name="real", storage_path=storage_path, verbose=0, **(rc_kw or {}))
    return tune.Tuner(trainable, param_space=param_space, tune_config=tc, run_config=rc).fit()


# ----------------------------------------------------------------- determinism


def asha_config(seed=3, **kw):
    return TuneConfig(metric="loss", mode="min", num_samples=300, seed=seed,
                      scheduler=ASHAScheduler(time_attr="training_iteration", max_t=20,
                                              grace_period=1, reduction_factor=3), **kw)


def test_same_seed_same_outcomes():
    def once(seed):
        ex = SimulatedExecutor(16, trial_model=varied_model, seed=seed, jitter=0.3)
        results = run_simulated("f", {"x": tune.uniform(0, 1)}, asha_config(seed), executor=ex)
        return outcomes(results), [r.metrics["trial_id"] for r in results], ex.now

    a, b, c = once(1), once(1), once(2)
    assert a == b
    assert a[0][0][0]["x"] != c[0][0][0]["x"] and a[2] != c[2]
    stopped_early = [o for o in a[0] if o[1] < 1 + int(o[0]["x"] * 19.999)]
    assert stopped_early, "ASHA stopped no trial: the case tests nothing"


# ----------------------------------------------------------------- real vs simulated


def test_asha_decisions_match_the_real_executor(local_client, storage_path):
    space = {"q": tune.uniform(0, 1)}

    def tc():
        return TuneConfig(metric="score", mode="max", num_samples=8, seed=11,
                          max_concurrent_trials=1,
                          scheduler=ASHAScheduler(time_attr="training_iteration", max_t=8,
                                                  grace_period=1, reduction_factor=2))

    real = run_real(asha_model, storage_path, space, tc())
    sim = run_simulated("f", space, tc(), executor=SimulatedExecutor(2, trial_model=asha_model))
    got, want = outcomes(sim), outcomes(real)
    assert got == want
    assert [r.metrics["training_iteration"] for r in real].count(8) < len(want), \
        "ASHA stopped no trial early: the case tests nothing"


def test_pbt_decisions_match_the_real_executor(local_client, storage_path):
    space = {"q": tune.choice([0.1, 0.3, 0.5, 0.7, 0.9])}

    def tc():
        return TuneConfig(
            metric="score", mode="max", num_samples=4, seed=5, max_concurrent_trials=1,
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration", perturbation_interval=2,
                hyperparam_mutations={"q": [0.1, 0.3, 0.5, 0.7, 0.9]}, seed=0))

    real = run_real(pbt_model, storage_path, space, tc())
    sim = run_simulated("f", space, tc(), executor=SimulatedExecutor(2, trial_model=pbt_model))
    assert outcomes(sim) == outcomes(real)
    # The same pauses and exploits, attempt by attempt, and the same checkpoints: a real
    # trial runs no iteration past a decision to pause or exploit it (its report is
    # acknowledged only after the driver decided), however busy the machine.
    assert attempts(sim) == attempts(real)
    assert checkpoint_iterations(sim) == checkpoint_iterations(real)
    assert {"paused", "exploited", "done"} <= {o for a in attempts(real) for o in a}


def test_pbt_exploits_continue_from_the_donor_checkpoint():
    space = {"q": tune.uniform(0, 1)}
    rec = Recorder()
    sched = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2,
                                    hyperparam_mutations={"q": tune.uniform(0, 1)}, seed=0)
    # 6 trials on 4 slots: PBT pauses trials so the queued ones get a turn (checkpoint-only
    # reports), and exploits clone the top trials' checkpoints.
    tc = TuneConfig(metric="score", mode="max", num_samples=6, seed=2, scheduler=sched)
    ex = SimulatedExecutor(4, trial_model=pbt_model, seed=0)
    results = run_simulated("f", space, tc, RunConfig(callbacks=[rec],
                            checkpoint_config=CheckpointConfig(num_to_keep=2)), executor=ex)
    assert all(r.metrics["training_iteration"] == 6 for r in results)
    # Each trial's results go up by exactly one (a pause resumes from the trial's own
    # checkpoint), except across an exploit: PBT decides one at a perturbation point (an
    # even iteration), and the trial continues from a donor's checkpoint (iterations 1-5
    # checkpoint), so its next result is 2..6, whatever it had reached.
    seen_exploit = False
    for tid, its in rec.iterations.items():
        assert its[0] == 1 and its[-1] == 6, (tid, its)
        counts = rec.exploits[tid]
        for (a, b), (ea, eb) in zip(zip(its, its[1:]), zip(counts, counts[1:])):
            assert eb - ea in (0, 1), (tid, its, counts)
            if eb == ea:
                assert b == a + 1, (tid, its, counts)
            else:
                seen_exploit = True
                assert a % 2 == 0 and 2 <= b <= 6, (tid, its, counts)
    assert seen_exploit
    ends = {p.outcome for t in results._trials for p in t.placements}
    assert {"paused", "exploited", "done"} <= ends, ends
    assert all(len(r.best_checkpoints) <= 2 for r in results)  # retention deleted fakes


def test_pbt_time_multiplexes_the_whole_population():
    """8 members on 2 slots (Ray's time multiplexing). The whole population exists from
    the start, so the scheduler chooses among all 8. Each member trains its 20
    iterations, with about one pause or exploit per perturbation interval, and no
    member is exploited over and over while the others wait."""
    space = {"q": tune.uniform(0, 1)}
    rec = Recorder()

    def model(config, trial_id):
        return [(1.0, {"score": config["q"] + 0.01 * i}, True) for i in range(20)]

    sched = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=4,
                                    hyperparam_mutations={"q": tune.uniform(0, 1)}, seed=0)
    tc = TuneConfig(metric="score", mode="max", num_samples=8, seed=1, scheduler=sched)
    results = run_simulated("f", space, tc, RunConfig(callbacks=[rec]),
                            executor=SimulatedExecutor(2, trial_model=model, seed=0))
    assert len(results) == 8
    assert all(r.metrics["training_iteration"] == 20 for r in results)
    # Every member started within the first 8 + 2 attempts: the population was there
    # from the start, not added as slots happened to free up.
    starts = sorted(p.start for t in results._trials for p in t.placements)
    assert max(t.placements[0].start for t in results._trials) <= starts[8 + 2]
    # Slots change hands about once per interval a member trains, not once a result.
    n_attempts = sum(len(t.placements) for t in results._trials)
    exploited = sum(p.outcome == "exploited" for t in results._trials for p in t.placements)
    assert exploited >= 1
    assert n_attempts <= 8 * (20 // 4) * 2, n_attempts
    # After an exploit, iterations count on from the donor's checkpoint (a perturbation
    # point, so >= 4) and are logged: each result is the next one, or a new lineage's.
    for its in rec.iterations.values():
        assert its[0] == 1 and all(b == a + 1 or b > 4 for a, b in zip(its, its[1:])), its


def test_each_iteration_takes_its_virtual_time():
    """A report is stamped when its iteration ends on the virtual clock: iterations of 1 s
    end at 1, 2, 3, 4 and of 2.5 s at 2.5, 5, 7.5, 10, whatever else ends at the same
    moment, and the run ends at 10 (``timestamp`` is whole seconds, as Ray's)."""
    stamps: dict[float, list[tuple[float, float]]] = defaultdict(list)

    class Stamps(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            stamps[trial.config["d"]].append((result["timestamp"] - int(EPOCH),
                                              result["time_total_s"]))

    ex = SimulatedExecutor(
        2, trial_model=lambda config, trial_id: [(config["d"], {"i": i}) for i in range(4)])
    run_simulated("f", {"d": tune.grid_search([1.0, 2.5])}, TuneConfig(),
                  RunConfig(callbacks=[Stamps()]), executor=ex)
    assert dict(stamps) == {1.0: [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)],
                            2.5: [(2, 2.5), (5, 5.0), (7, 7.5), (10, 10.0)]}
    assert ex.now == 10.0


def test_a_lost_workers_trial_restarts_at_the_moment_of_the_loss():
    """Worker 0 is lost at 2.5 s while another trial's iterations end at 3, 4, ...: the
    lost trial restarts at 2.5 (from scratch), so its iterations end at 3.5, 4.5, 5.5,
    6.5, not one event later (the repeated first two are not logged again)."""
    stamps: dict[float, list[tuple[int, float]]] = defaultdict(list)

    class Stamps(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            stamps[trial.config["d"]].append((result["training_iteration"],
                                              result["timestamp"] - int(EPOCH)))

    ex = SimulatedExecutor(
        3, trial_model=lambda config, trial_id: [(config["d"], {"i": i}) for i in range(4)])
    ex.kill_workers(["sim://worker-0000"], at=2.5)
    run_simulated("f", {"d": tune.grid_search([1.0, 1.5])}, TuneConfig(),
                  RunConfig(callbacks=[Stamps()]), executor=ex)
    # The 1 s trial ran on worker 0 (whole-second timestamps, as Ray's).
    assert stamps[1.0] == [(1, 1), (2, 2), (3, 5), (4, 6)]
    assert stamps[1.5] == [(1, 1), (2, 3), (3, 4), (4, 6)]


def test_a_retiring_workers_trial_moves_after_its_checkpoint_and_loses_nothing():
    """Worker 0 retires at 2.5 s (a spot notice): its trial ends after its next
    checkpoint (iteration 3, at 3 s) and resumes from it on worker 1 once that worker's
    own trial is done (6 s); no iteration runs twice or is lost, nothing starts on the
    retiring worker, and it leaves once free."""
    rec = Recorder()
    hosts: dict[float, list[str]] = defaultdict(list)

    class Hosts(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            hosts[trial.config["d"]].append(result["hostname"])

    ex = SimulatedExecutor(
        2, trial_model=lambda config, trial_id: [(config["d"], {"i": i}, True)
                                                 for i in range(6)])
    ex.retire_workers(["sim://worker-0000"], at=2.5)
    results = run_simulated("f", {"d": tune.grid_search([1.0, 1.0001])}, TuneConfig(),
                            RunConfig(callbacks=[rec, Hosts()]), executor=ex)
    assert results.num_terminated == 2
    for r in results:
        assert rec.iterations[r.metrics["trial_id"]] == [1, 2, 3, 4, 5, 6]
    # The first trial ran on worker 0 until its checkpoint after the notice, then on 1.
    assert hosts[1.0] == ["worker-0000"] * 3 + ["worker-0001"] * 3
    assert hosts[1.0001] == ["worker-0001"] * 6
    assert list(ex.workers()) == ["sim://worker-0001"]
    with pytest.raises(ValueError, match="unknown worker"):
        ex.retire_workers(["sim://nowhere"])


# ----------------------------------------------------------------- load


def test_no_report_lost_or_reordered_under_load():
    rec = Recorder()
    ex = SimulatedExecutor(256, trial_model=varied_model, seed=4, jitter=0.5)
    tc = TuneConfig(metric="loss", mode="min", num_samples=1000, seed=4)
    results = run_simulated("f", {"x": tune.uniform(0, 1)}, tc, RunConfig(callbacks=[rec]),
                            executor=ex)
    assert len(results) == 1000 and results.num_terminated == 1000
    for r in results:
        n = len(varied_model(r.config, ""))
        assert rec.iterations[r.metrics["trial_id"]] == list(range(1, n + 1))
    assert sum(len(v) for v in rec.iterations.values()) == ex.num_reports


def test_stop_dict_and_checkpoints():
    ex = SimulatedExecutor(8, trial_model=varied_model)
    rc = RunConfig(stop={"training_iteration": 3},
                   checkpoint_config=CheckpointConfig(checkpoint_frequency=1, num_to_keep=2))
    results = run_simulated("f", {"x": tune.uniform(0.5, 1)}, TuneConfig(num_samples=20, seed=1),
                            rc, executor=ex)
    for r in results:
        assert r.metrics["training_iteration"] == 3 and r.metrics["done"] is True
        assert [c.path.rsplit("_", 1)[-1] for c, _ in r.best_checkpoints] == ["000001", "000002"]


def test_losing_ten_percent_of_the_workers_at_once():
    rec = Recorder()
    ex = SimulatedExecutor(100, trial_model=varied_model, seed=1)
    ex.kill_workers([f"sim://worker-{i:04d}" for i in range(0, 100, 10)], at=5.0)
    rc = RunConfig(callbacks=[rec], checkpoint_config=CheckpointConfig(checkpoint_frequency=2))
    results = run_simulated("f", {"x": tune.uniform(0, 1)}, TuneConfig(num_samples=400, seed=1),
                            rc, executor=ex)
    assert results.num_terminated == 400
    assert len(ex.workers()) == 90
    lost = [t for t in results._trials if any(p.outcome == "lost" for p in t.placements)]
    assert len(lost) == 10  # one trial per lost worker, each restarted elsewhere
    for r in results:  # a restart resumes from its checkpoint: no result logged twice
        n = len(varied_model(r.config, ""))
        assert rec.iterations[r.metrics["trial_id"]] == list(range(1, n + 1))


def test_driver_memory_is_flat_in_the_number_of_reports():
    def peak(iterations):
        ex = SimulatedExecutor(20, trial_model=lambda config, trial_id: LazySteps(iterations))
        tracemalloc.start()
        try:
            run_simulated("f", {"x": tune.uniform(0, 1)}, TuneConfig(num_samples=20, seed=0),
                          executor=ex)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    # 1.2k and 6k reports from 20 trials (tracemalloc makes each allocation ~10x dearer;
    # benchmarks/scale/memory.py goes to 100k): what the driver keeps is per trial.
    small, large = peak(60), peak(300)
    assert large < small * 1.3 + 256 * 1024, (small, large)


# ----------------------------------------------------------------- input


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="trial_model"):
        SimulatedExecutor(2)
    with pytest.raises(ValueError, match="n_workers"):
        SimulatedExecutor(-1, trial_model=asha_model)
    with pytest.raises(ValueError, match="jitter"):
        SimulatedExecutor(1, trial_model=asha_model, jitter=2)
    with pytest.raises(TypeError, match="executor"):
        run_simulated("f", {}, executor=None)
    with pytest.raises(ValueError, match="unknown worker"):
        SimulatedExecutor(1, trial_model=asha_model).kill_workers(["sim://nope"])
    ex = SimulatedExecutor(1, trial_model=lambda c, t: [(1.0, "not a dict")])
    with pytest.raises(TypeError, match="duration_s, metrics"):
        run_simulated("f", {}, executor=ex)
    ex = SimulatedExecutor(1, trial_model=asha_model)
    results = run_simulated("f", {"q": 0.5}, TuneConfig(num_samples=1),
                            RunConfig(stop={"nope": 1}), executor=ex)
    assert results.num_errors == 1 and "'nope'" in str(results.errors[0])


def test_hyperband_cost_does_not_depend_on_the_slot_count():
    """Few slots add trials to a bracket one by one: it must still halve only once full
    (or once the searcher has run dry), so the cost is HyperBand's, not FIFO's."""
    from dasktune.schedulers import HyperBandScheduler

    def curve(config, trial_id):
        return [(1.0, {"score": config["q"] * (1 - 0.9 ** (i + 1))}, True) for i in range(27)]

    def run(slots):
        tc = TuneConfig(metric="score", mode="max", num_samples=81, seed=0,
                        scheduler=HyperBandScheduler(max_t=27, reduction_factor=3))
        results = run_simulated("f", {"q": tune.uniform(0, 1)}, tc,
                                executor=SimulatedExecutor(slots, trial_model=curve))
        its = [r.metrics["training_iteration"] for r in results]
        best = max(results, key=lambda r: r.config["q"])
        assert best.metrics["training_iteration"] == 27  # the best config ran to the end
        return sum(its), its.count(27)

    few, many = run(4), run(81)
    fifo = 81 * 27
    # Ray's bracket arithmetic for 81 trials, max_t 27, eta 3: ~33% of FIFO's iterations
    # (+ at most one iteration per cut trial that was running when cut).
    assert few[0] < 0.37 * fifo and many[0] < 0.37 * fifo, (few, many)
    assert few[1] == many[1]
