"""A driver SIGKILLed mid-experiment, then restored, again and again (issue 4, test 5).

The driver is a separate script (``Tuner(...).fit()``, or ``Tuner.restore(...).fit()``
once ``Tuner.can_restore(path)``) in its own process group on a real scheduler and
workers; the test kills the whole group at seeded moments, each once the trials
have made some progress in that life, and restarts it until it exits by itself.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from conftest import driver_lives, logged_iterations, logged_rows

import dasktune as tune

pytestmark = pytest.mark.slow

DRIVER = r'''
import json, os, shutil, sys, tempfile, time
import dasktune as tune

address, storage, name = sys.argv[1:4]

def train(config):
    ctx = tune.get_context()
    d, attempt = ctx.get_trial_dir(), ctx.get_attempt()
    restored = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as c, open(os.path.join(c, "s.json")) as f:
            restored = json.load(f)["i"]
    with open(os.path.join(d, "attempts.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": attempt, "restored": restored, "pid": os.getpid(),
                            "t": time.time()}) + "\n")
    for i in range(restored + 1, config["iters"] + 1):
        time.sleep(config["sleep"])
        with open(os.path.join(d, "executed.jsonl"), "a") as f:
            f.write(json.dumps({"attempt": attempt, "it": i, "t": time.time()}) + "\n")
        ck = None
        if i % config["k"] == 0:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "s.json"), "w") as f:
                json.dump({"i": i}, f)
            ck = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i}, checkpoint=ck)

tune.init(address=address)
path = os.path.join(storage, name)
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, train)
else:
    tuner = tune.Tuner(train, param_space={"x": tune.grid_search(list(range(6))), "iters": 15,
                                           "k": 3, "sleep": 0.3},
                       run_config=tune.RunConfig(
                           name=name, storage_path=storage, verbose=0,
                           checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
results = tuner.fit()
print("DONE", json.dumps({"n": len(results), "terminated": results.num_terminated,
                          "errors": len(results.errors)}), flush=True)
'''


def test_driver_killed_repeatedly_then_restored(dask_processes, tmp_path):
    procs = dask_processes(n_workers=2, resources="CPU=3")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "driver"
    exp = os.path.join(storage, name)
    # Progress of a life: rows it logged (zombie attempts log nothing).
    lives, kills, out = driver_lives(script, [procs.address, storage, name], tmp_path,
                                     progress=lambda: logged_rows(exp), rng=random.Random(5))
    done = json.loads(out.split("DONE", 1)[1].strip().splitlines()[0])
    assert done == {"n": 6, "terminated": 6, "errors": 0}
    state = json.load(open(os.path.join(exp, "experiment_state.json")))
    assert len(state["trials"]) == 6  # each trial made exactly once
    assert {t["status"] for t in state["trials"]} == {"TERMINATED"}
    trial_dirs = [d for d in os.listdir(exp) if os.path.isdir(os.path.join(exp, d))]
    assert len(trial_dirs) == 6
    analysis = tune.ExperimentAnalysis(exp)
    frames = {os.path.basename(t.path): analysis.trial_dataframes[t.trial_id]
              for t in analysis.trials}  # each trial's Result.metrics_dataframe
    for d in trial_dirs:
        files = logged_iterations(os.path.join(exp, d), "ray/tune/i")
        checkpoints = files.pop("checkpoints")
        # Progress never went backwards across the driver's lives: each iteration once,
        # in every result file (issue 24).
        files["metrics_dataframe"] = list(frames[d]["training_iteration"])
        for what, its in files.items():
            assert its == list(range(1, 16)), (d, what, its)
        # num_to_keep=2 held across the restores: the newest two of the last lineage.
        assert checkpoints == [12, 15], (d, checkpoints)
        folders = [n for n in os.listdir(os.path.join(exp, d)) if n.startswith("checkpoint_")]
        assert len(folders) == 2, (d, folders)  # no uncommitted or superseded one left
        with open(os.path.join(exp, d, "attempts.jsonl")) as f:
            attempts = [json.loads(line) for line in f if line.strip()]
        # A resumed attempt never starts over when a checkpoint existed before it.
        for prev, cur in zip(attempts, attempts[1:]):
            assert cur["restored"] >= prev["restored"], (d, attempts)
    assert kills == 3  # no life finished early (zombies of earlier lives did no work)
    print(f"\ndriver: {lives} lives, {kills} SIGKILLs, finished at {time.strftime('%X')}")
