"""PBT on the embedded cluster: clones restore donors' checkpoints while the donors go on
training and retention deletes their older checkpoints."""

from __future__ import annotations

import json
import os
import tempfile
import time

import dasktune as tune
from dasktune.schedulers import PopulationBasedTraining

READ_DELAY_S = 0.5  # a clone reads its donor's checkpoint this long after it starts


def slow_to_restore(config):
    """Checkpoints every step; a restored run reads its checkpoint only after a delay, by
    which time a donor that kept training has committed several newer ones."""
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        time.sleep(READ_DELAY_S)
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            step = json.load(f)["step"]
    while step < config["steps"]:
        step += 1
        time.sleep(0.02)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"score": step * config["lr"], "step": step},
                        checkpoint=tune.Checkpoint.from_directory(d))


def test_a_donor_checkpoint_outlives_retention_until_the_clone_has_its_own(
        local_client, storage_path):
    # Two members on the cluster's two slots: neither pauses, so the donor keeps training
    # (and, with num_to_keep=1, deleting its older checkpoints) while the clone restores.
    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=4,
                                  hyperparam_mutations={"lr": [0.5, 1.0, 2.0]}, seed=0)
    grid = tune.Tuner(
        slow_to_restore,
        param_space={"lr": tune.grid_search([0.5, 2.0]), "steps": 40},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1)),
    ).fit()
    policy = os.path.join(grid.experiment_path, "pbt_global.txt")
    assert os.path.exists(policy), "no exploit: the case tests nothing"
    assert not grid.errors, grid.errors
    assert all(r.metrics["step"] == 40 for r in grid)
    for result in grid:  # retention still holds: one checkpoint per trial at the end
        folders = [p for p in os.listdir(result.path) if p.startswith("checkpoint_")]
        assert len(folders) == 1, folders
