"""A trial the killed driver made and finished after its last state save is not run again
(issue 24): the restored searcher suggests it again, the restored driver finds its folder
(trial-end marker, same ``params.json``) and adopts it, TERMINATED with its record.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import subprocess

import pytest
from conftest import driver_life, kill_driver, wait_for

DRIVER = r'''
import os, sys, time
import dasktune as tune

storage, name = sys.argv[1:3]

def saved(trial_id, d):
    """Whether the experiment state lists this trial (a restore knows it then)."""
    try:
        with open(os.path.join(os.path.dirname(d), "experiment_state.json")) as f:
            return trial_id in f.read()
    except OSError:
        return False

def logged(d):
    try:
        with open(os.path.join(d, "result.json")) as f:
            return sum(1 for line in f if line.endswith("\n"))
    except OSError:
        return 0

def train(config):
    ctx = tune.get_context()
    d = ctx.get_trial_dir()
    with open(os.path.join(os.path.dirname(d), "runs.txt"), "a") as f:
        f.write(f"{config['x']}\n")  # beside the trial folders: one a restore may delete
    if config["x"] == 0:  # the first trial: in the state's first save
        deadline = time.monotonic() + 60
        while not saved(ctx.get_trial_id(), d) and time.monotonic() < deadline:
            time.sleep(0.05)
    for i in range(1, 4):
        if config["x"] == 1 and i == 3:  # its first rows reach result.json, the last not
            deadline = time.monotonic() + 60
            while logged(d) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        tune.report({"score": config["x"] * 10 + i})

class Heard(tune.Callback):
    """Notes each completion the driver hears; the trial x=1 (made after the state's last
    save) stalls the driver right after it finished, before any save (STALL: first life)."""
    def on_trial_complete(self, iteration, trials, trial, **info):
        with open(os.path.join(os.path.dirname(trial.path), "heard.txt"), "a") as f:
            f.write(f"{os.environ.get('LIFE')} {trial.config['x']}\n")
        if os.environ.get("STALL") and trial.config["x"] == 1:
            open(os.path.join(trial.path, "stalled"), "w").close()
            time.sleep(3600)

tune.init(num_cpus=2)
path = os.path.join(storage, name)
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, train)
else:
    tuner = tune.Tuner(train, param_space={"x": tune.grid_search([0, 1, 2])},
                       tune_config=tune.TuneConfig(metric="score", mode="max",
                                                   max_concurrent_trials=1),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                 callbacks=[Heard()]))
results = tuner.fit()
print("DONE", sorted((r.config["x"], r.metrics["score"]) for r in results),
      results.num_terminated, flush=True)
'''


@pytest.mark.slow
def test_a_trial_finished_after_the_last_save_is_adopted_not_run_again(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "unsaved"
    exp = os.path.join(storage, name)

    def life(n: int, stall: bool) -> contextlib.AbstractContextManager[subprocess.Popen]:
        env = dict(os.environ, LIFE=str(n))
        env.pop("STALL", None)
        if stall:
            env["STALL"] = "1"
            # The state is saved at the first step and then at most when a trial ends
            # (the period never comes), and no successor is made before its slot frees:
            # the trial x=1 is made after the last save, and no save comes before its end.
            env["DASK_DASKTUNE__CONTROLLER__CHECKPOINT_PERIOD"] = "1h"
            env["DASK_DASKTUNE__EXECUTOR__QUEUE_NEXT"] = "False"
        return driver_life(script, [storage, name], tmp_path / f"driver-{n}.log", env)

    def stalled() -> list[str]:
        return glob.glob(os.path.join(exp, "*", "stalled"))

    with life(1, stall=True) as driver:
        wait_for(lambda: stalled() or driver.poll() is not None, timeout=120,
                 what="the driver to hear the trial x=1 end")
        assert driver.poll() is None, (tmp_path / "driver-1.log").read_text()[-3000:]
        # Killed right after the trial finished, before any save saw it (its whole process
        # group, the embedded cluster with it).
        kill_driver(driver)
    trial_dir = os.path.dirname(stalled()[0])
    with open(os.path.join(trial_dir, "params.json")) as f:
        assert json.load(f) == {"x": 1}
    assert os.path.exists(os.path.join(trial_dir, ".dasktune_trial_end.json"))
    with open(os.path.join(exp, "experiment_state.json")) as f:
        state = json.load(f)["trials"]
    assert [t["config"] for t in state] == [{"x": 0}]  # the state never saw x=1
    # (x=0's end may have been saved, or only its worker's marker tells of it.)
    first_saved_ended = state[0]["status"] == "TERMINATED"
    with open(os.path.join(trial_dir, "result.json")) as f:
        assert len(f.read().splitlines()) in (2, 3)  # the last row may not have landed

    with life(2, stall=False) as driver:
        driver.wait(180)
    out = (tmp_path / "driver-2.log").read_text()
    assert driver.returncode == 0, out[-3000:]
    assert "DONE [(0, 3), (1, 13), (2, 23)] 3" in out, out[-3000:]
    with open(os.path.join(exp, "runs.txt")) as f:
        runs = f.read().splitlines()
    assert sorted(runs) == ["0", "1", "2"]  # x=1 ran once, in the killed driver's life
    with open(os.path.join(trial_dir, "result.json")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    with open(os.path.join(trial_dir, "progress.csv")) as f:
        assert len(f.read().splitlines()) == 1 + 3  # header and each iteration once
    with open(os.path.join(exp, "experiment_state.json")) as f:
        state = {json.dumps(t["config"]): t for t in json.load(f)["trials"]}
    adopted = state['{"x": 1}']
    assert adopted["status"] == "TERMINATED"
    assert adopted["last_result"]["score"] == 13
    assert adopted["path"].rstrip("/").endswith(os.path.basename(trial_dir))
    # The restored driver heard its end once (as the searcher and scheduler did), and
    # ran the trial after it.
    with open(os.path.join(exp, "heard.txt")) as f:
        heard = f.read().splitlines()
    assert heard == ["1 0", "1 1", *([] if first_saved_ended else ["2 0"]), "2 1", "2 2"]
    # Its folder is the one trial folder for x=1: nothing was made again beside it.
    params = glob.glob(os.path.join(exp, "*", "params.json"))
    assert sorted(json.load(open(p))["x"] for p in params) == [0, 1, 2]
