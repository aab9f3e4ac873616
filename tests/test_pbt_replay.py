"""PopulationBasedTrainingReplay: a PBT run's policy file, replayed on one trial, gives the
config schedule that trial's lineage had; on the real driver loop with simulated trials."""

from __future__ import annotations

import importlib
import json
import math

import pytest

import dasktune as tune
from dasktune.callback import Callback
from dasktune.config import CheckpointConfig, RunConfig, TuneConfig
from dasktune.schedulers import (
    Exploit,
    PopulationBasedTraining,
    PopulationBasedTrainingReplay,
    Reconfigure,
    create_scheduler,
)
from dasktune.schedulers.testing import SimpleContext
from dasktune.simulator import SimulatedExecutor, run_simulated
from dasktune.trial import Trial

ITERS, INTERVAL = 30, 3


def model(config, trial_id):  # the best lr is 0.01; progress accrues with iterations
    rate = 1 - abs(math.log10(config["lr"]) + 2) / 3
    return [(1.0, {"score": i * rate}) for i in range(1, ITERS + 1)]


class Configs(Callback):
    """Each trial's config at each iteration it logged (a restart overwrites the ones
    after its checkpoint)."""

    def __init__(self):
        self.history: dict[str, dict[int, dict]] = {}

    def __deepcopy__(self, memo):  # fit() copies the scheduler: LineagePBT keeps this one
        return self

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.history.setdefault(trial.trial_id, {})[result["training_iteration"]] = \
            dict(result["config"])


class LineagePBT(PopulationBasedTraining):
    """PBT that also keeps each trial's lineage: an exploited trial takes over its donor's
    history up to the donor checkpoint it goes on from."""

    def __init__(self, configs: Configs, **kw):
        super().__init__(**kw)
        self.configs = configs

    def on_trial_result(self, ctx, trial, result):
        decision = super().on_trial_result(ctx, trial, result)
        if isinstance(decision, Exploit):
            donor = next(t for t in ctx.get_trials() if t.trial_id == decision.donor_trial_id)
            at = next(c["iteration"] for c in donor.checkpoints
                      if c["path"] == decision.checkpoint)
            self.configs.history[trial.trial_id] = {
                i: c for i, c in self.configs.history[donor.trial_id].items() if i <= at}
        return decision


def run(scheduler, param_space, storage, callback, num_samples):
    return run_simulated(
        "toy", param_space,
        TuneConfig(scheduler=scheduler, num_samples=num_samples),
        RunConfig(storage_path=str(storage), name="exp", callbacks=[callback],
                  stop={"training_iteration": ITERS},
                  checkpoint_config=CheckpointConfig(checkpoint_frequency=INTERVAL)),
        SimulatedExecutor(2, trial_model=model, seed=0))


def test_replaying_a_pbt_policy_file_gives_the_same_config_schedule(tmp_path):
    lrs = [0.0001, 0.001, 0.01, 0.1, 1.0]
    original = Configs()
    pbt = LineagePBT(original, time_attr="training_iteration", metric="score", mode="max",
                     perturbation_interval=INTERVAL, hyperparam_mutations={"lr": lrs}, seed=0)
    grid = run(pbt, {"lr": tune.grid_search(lrs)}, tmp_path / "pbt", original, 2)
    assert all(r.metrics["training_iteration"] == ITERS for r in grid)
    folder = tmp_path / "pbt" / "exp"
    replayed = 0
    longest = 0
    for trial_id, lineage in original.history.items():
        policy = folder / f"pbt_policy_{trial_id}.txt"
        if not policy.exists():
            continue
        replay_configs = Configs()
        replay = PopulationBasedTrainingReplay(str(policy))
        longest = max(longest, len(replay.schedule))
        run(replay, {}, tmp_path / f"replay-{trial_id}", replay_configs, 1)
        [history] = replay_configs.history.values()
        assert history == lineage, trial_id
        replayed += 1
    assert replayed >= 3 and longest >= 2  # several files, and chains of several exploits


def test_policy_chain_and_errors(tmp_path):
    a, b, c = {"lr": 1}, {"lr": 2}, {"lr": 3}
    lines = [["0", "5", 3, 3, {"lr": 9}, {"lr": 8}],  # overwritten: 0 was not the donor
             ["1", "2", 3, 3, a, b],  # 1 took 2's checkpoint at 3 with b
             ["0", "1", 6, 6, b, c]]  # then 0 took 1's at 6 with c
    path = tmp_path / "pbt_policy_x.txt"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    replay = PopulationBasedTrainingReplay(str(path))
    assert replay.config == a and replay.schedule == [(3, b), (6, c)]
    trial = Trial(trial_id="r", config={})
    ctx = SimpleContext([trial])
    replay.on_trial_add(ctx, trial)
    assert trial.config == a
    decisions = [replay.on_trial_result(ctx, trial, {"training_iteration": i})
                 for i in range(1, 8)]
    assert decisions == ["CONTINUE"] * 2 + [Reconfigure(config=b)] + ["CONTINUE"] * 2 + \
        [Reconfigure(config=c)] + ["CONTINUE"]
    with pytest.raises(ValueError, match="More than one trial"):
        replay.on_trial_add(ctx, Trial(trial_id="s", config={}))
    with pytest.raises(ValueError, match="Policy file not found"):
        PopulationBasedTrainingReplay(str(tmp_path / "nope.txt"))
    (tmp_path / "bad.txt").write_text("not json\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        PopulationBasedTrainingReplay(str(tmp_path / "bad.txt"))
    (tmp_path / "empty.txt").write_text("")
    empty = PopulationBasedTrainingReplay(str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match="has no schedule and the trial has no config"):
        empty.on_trial_add(ctx, Trial(trial_id="t", config={}))
    assert importlib.import_module("dasktune.schedulers.pbt").PopulationBasedTrainingReplay \
        is PopulationBasedTrainingReplay
    assert isinstance(create_scheduler("pbt_replay", policy_file=str(path)),
                      PopulationBasedTrainingReplay)
