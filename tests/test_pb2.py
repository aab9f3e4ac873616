"""PB2: PBT's exploit with a GP bandit's explore, on toys where one end of a bound is better."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("sklearn")

from dasktune.schedulers import PB2, Exploit, create_scheduler  # noqa: E402
from dasktune.schedulers.testing import SimpleContext, SimulatedRun  # noqa: E402
from dasktune.trial import RUNNING, Trial  # noqa: E402


class Accumulating:
    """A score that grows by ``rate(config)`` per iteration and that an exploited trial takes
    over from its donor's checkpoint (as real weights would be), for :class:`SimulatedRun`."""

    def __init__(self, sched: PB2, rate):
        self.sched, self.rate = sched, rate
        self.score: dict[tuple[str, int], float] = {}  # (trial, iteration) -> score
        self.last: dict[str, int] = {}

    def __call__(self, trial: Trial, it: int) -> dict[str, float]:
        tid = trial.trial_id
        if self.last.get(tid, 0) + 1 == it:
            base = self.score.get((tid, it - 1), 0.0)
        else:  # restarted from its donor's checkpoint (sim/<donor>/checkpoint_<it>)
            ckpt = [p for p in self.sched.perturbations if p["trial_id"] == tid][-1]
            _, donor, name = ckpt["donor_checkpoint"].split("/")
            base = self.score[(donor, int(name.rsplit("_", 1)[1]))]
        self.last[tid] = it
        self.score[(tid, it)] = base + self.rate(trial.config)
        return {"score": self.score[(tid, it)]}


def run_toy(better: str, seed: int, max_iter: int = 60) -> tuple[list[Trial], PB2]:
    sched = PB2(time_attr="training_iteration", metric="score", mode="max",
                perturbation_interval=4, hyperparam_bounds={"opt": {"lr": [0.0, 1.0]}},
                seed=seed)
    # Everyone starts in the middle fifth; the better end is far from all of them.
    trials = [Trial(trial_id=f"t{i}", config={"opt": {"lr": 0.4 + 0.05 * i}, "x": i})
              for i in range(5)]
    if better == "high":
        def rate(c):
            return c["opt"]["lr"]
    else:
        def rate(c):
            return 1.0 - c["opt"]["lr"]
    model = Accumulating(sched, rate)
    SimulatedRun(sched, trials, model, slots=5, max_iter=max_iter).run()
    return trials, sched


@pytest.mark.slow
@pytest.mark.parametrize("better", ["high", "low"])
def test_pb2_moves_the_population_toward_the_better_bound(better):
    trials, sched = run_toy(better, seed=0)
    new = [p["new_config"]["opt"]["lr"] for p in sched.perturbations]
    assert len(new) >= 5
    assert all(0.0 <= lr <= 1.0 for lr in new), new  # within hyperparam_bounds
    final = sorted(t.config["opt"]["lr"] for t in trials)
    # Everyone started in [0.4, 0.6]: selection alone (donors' values kept) cannot leave
    # that range. Most of the GP's choices are on the better half, and the population ends
    # at the better end.
    chosen = sorted(new)[len(new) // 2]
    if better == "high":
        assert chosen > 0.5 and final[2] >= 0.85, (new, final)
    else:
        assert chosen < 0.5 and final[2] <= 0.15, (new, final)


def test_pb2_is_reproducible_with_a_seed_and_round_trips_its_state(tmp_path):
    first, a = run_toy("high", 3, max_iter=24)
    second, b = run_toy("high", 3, max_iter=24)
    assert [t.config for t in first] == [t.config for t in second]
    a.save(str(tmp_path / "pb2.pkl"))
    fresh = PB2(metric="score", mode="max", hyperparam_bounds={"opt": {"lr": [0.0, 1.0]}})
    fresh.restore(str(tmp_path / "pb2.pkl"))
    assert fresh.get_state()["_records"] == a.get_state()["_records"]


def test_pb2_fills_missing_values_within_bounds_and_keeps_ints():
    sched = PB2(time_attr="training_iteration", metric="m", mode="max",
                perturbation_interval=1, hyperparam_bounds={"lr": [0.01, 0.1], "n": [2, 9]},
                seed=0)
    trials = [Trial(trial_id=f"t{i}", config={"n": 2 + i, "x": i}) for i in range(4)]
    ctx = SimpleContext(trials)
    for t in trials:
        sched.on_trial_add(ctx, t)
        assert 0.01 <= t.config["lr"] <= 0.1 and t.evaluated_params["lr"] == t.config["lr"]
        t.status = RUNNING
        t.checkpoint = f"ckpt/{t.trial_id}"
    decisions = []
    for it in range(1, 6):
        for rank, t in enumerate(trials):
            decisions.append(sched.on_trial_result(
                ctx, t, {"training_iteration": it, "m": float(rank * it)}))
    exploits = [d for d in decisions if isinstance(d, Exploit)]
    assert exploits
    for d in exploits:
        donor = next(t for t in trials if t.trial_id == d.donor_trial_id)
        assert d.config["x"] == donor.config["x"]  # the donor's other keys, unchanged
        assert isinstance(d.config["n"], int) and 2 <= d.config["n"] <= 9
        assert 0.01 <= d.config["lr"] <= 0.1


def test_pb2_paths_and_errors():
    assert importlib.import_module("dasktune.schedulers.pb2").PB2 is PB2
    assert isinstance(create_scheduler("pb2", metric="m", mode="max",
                                       hyperparam_bounds={"lr": [0, 1]}), PB2)
    with pytest.raises(ValueError, match="hyperparam_bounds must be given"):
        PB2(metric="m", mode="max")
    with pytest.raises(ValueError, match=r"\[low, high\].*'opt/lr'"):
        PB2(metric="m", mode="max", hyperparam_bounds={"opt": {"lr": [0.1]}})
    with pytest.raises(ValueError, match="low <= high"):
        PB2(metric="m", mode="max", hyperparam_bounds={"lr": [1, 0]})
    with pytest.raises(ValueError, match="quantile_fraction"):
        PB2(metric="m", mode="max", hyperparam_bounds={"lr": [0, 1]}, quantile_fraction=0.9)
