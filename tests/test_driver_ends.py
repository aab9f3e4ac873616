"""Trials the driver ends are ended for good (issue 24): an ASHA stop, a Stopper, the time
budget. The driver records the end in the trial's end marker (who ended it, why, at which
rung) before anything else says so, and a restore after a driver kill shows the trial
TERMINATED with its last result and never runs it again.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import subprocess
import time

import pytest
from conftest import driver_life, kill_driver, wait_for

import dasktune as tune
from dasktune.config import RunConfig, TuneConfig
from dasktune.schedulers import ASHAScheduler
from dasktune.simulator import SimulatedExecutor, run_simulated
from dasktune.stopper import TrialPlateauStopper
from dasktune.storage import TRIAL_END_FILE


def _marker(trial_path: str) -> dict | None:
    path = os.path.join(trial_path, TRIAL_END_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _curve(config, trial_id):
    """12 iterations; the loss is flat from iteration 4 for x < 0.5."""
    x = config["x"]
    return [(1.0, {"loss": x + (1.0 / (i + 1) if x >= 0.5 or i < 3 else 0.25)})
            for i in range(12)]


def test_an_asha_stop_is_recorded_with_its_rung(tmp_path):
    tc = TuneConfig(metric="loss", mode="min", num_samples=12, seed=3,
                    scheduler=ASHAScheduler(time_attr="training_iteration", max_t=12,
                                            grace_period=1, reduction_factor=3))
    results = run_simulated("f", {"x": tune.uniform(0, 1)}, tc,
                            RunConfig(name="asha", storage_path=str(tmp_path)),
                            executor=SimulatedExecutor(4, trial_model=_curve, seed=0))
    stopped = [t for t in results._trials if t.last_result["training_iteration"] < 12]
    assert stopped, "ASHA stopped no trial: the case tests nothing"
    for trial in results._trials:
        end = _marker(trial.path)
        it = trial.last_result["training_iteration"]
        if it == 12:
            # Ended at max_t (ASHA's STOP there too), or by itself: not stopped early
            # unless ASHA said so, and then at rung 12.
            assert end is None or end["rung"] in (None, {"time_attr": "training_iteration",
                                                         "value": 12})
            continue
        assert trial.status == "TERMINATED" and trial.stop_reason == "early_stopped"
        assert trial.stop_rung == {"time_attr": "training_iteration", "value": it}
        assert end is not None, trial.trial_id
        assert end["ended_by"] == "scheduler"
        assert end["reason"] == f"AsyncHyperBandScheduler stopped it early at " \
                                f"training_iteration {it}"
        assert end["rung"] == {"time_attr": "training_iteration", "value": it}
        assert end["attempt"] == trial.attempt
        assert end["result"]["training_iteration"] == it and "config" not in end["result"]
        assert end["result"]["loss"] == trial.last_result["loss"]


def test_a_stopper_end_is_recorded(tmp_path):
    stopper = TrialPlateauStopper("loss", std=1e-6, num_results=3, grace_period=3)
    results = run_simulated("f", {"x": tune.grid_search([0.2, 0.8])}, TuneConfig(),
                            RunConfig(name="plateau", storage_path=str(tmp_path), stop=stopper),
                            executor=SimulatedExecutor(2, trial_model=_curve))
    by_x = {r.config["x"]: r for r in results}
    # x=0.2 is flat from iteration 4: three equal results at iteration 6.
    assert by_x[0.2].metrics["training_iteration"] == 6
    assert by_x[0.8].metrics["training_iteration"] == 12
    flat = next(t for t in results._trials if t.config["x"] == 0.2)
    end = _marker(flat.path)
    assert end["ended_by"] == "stopper" and "TrialPlateauStopper" in end["reason"]
    assert end["result"]["training_iteration"] == 6 and end["rung"] is None
    assert flat.stop_rung is None
    # The other ended by itself; the simulated executor has no worker to record that.
    assert _marker(next(t for t in results._trials if t.config["x"] == 0.8).path) is None


def _sleepy(config):
    for i in range(200):
        time.sleep(0.05)
        tune.report({"i": i})


def test_the_time_budget_end_is_recorded(local_client, tmp_path):
    results = tune.Tuner(
        _sleepy, param_space={"x": tune.grid_search([1, 2])},
        tune_config=TuneConfig(time_budget_s=1.5),
        run_config=RunConfig(name="budget", storage_path=str(tmp_path), verbose=0)).fit()
    assert len(results) == 2 and not results.errors
    for r in results:
        end = _marker(r.path)
        assert end is not None and end["ended_by"] == "experiment", end
        assert "time budget of 1.5s reached" in end["reason"]
        # Its last result (none if the budget ran out before it reported, on a busy host).
        assert end["result"].get("training_iteration") == \
            r.metrics.get("training_iteration")


DRIVER = r'''
import os, sys, time
import dasktune as tune

storage, name, mode = sys.argv[1:4]

def saved(trial_id, d):
    """Whether the experiment state lists this trial (a restore knows it then)."""
    try:
        with open(os.path.join(os.path.dirname(d), "experiment_state.json")) as f:
            return trial_id in f.read()
    except OSError:
        return False

def train(config):
    ctx = tune.get_context()
    d = ctx.get_trial_dir()
    with open(os.path.join(d, "runs.txt"), "a") as f:
        f.write("run\n")
    deadline = time.monotonic() + 60
    while not saved(ctx.get_trial_id(), d) and time.monotonic() < deadline:
        time.sleep(0.05)
    for i in range(1, 13):
        time.sleep(0.1)
        tune.report({"score": config["score"], "i": i})

class Stall(tune.Callback):
    """The driver stalls right after it decided the stalled trial's end, before it saves
    that anywhere, as a driver killed in that instant would (STALL: first life only)."""
    def on_trial_complete(self, iteration, trials, trial, **info):
        if os.environ.get("STALL") and trial.config["score"] < 0.5:
            open(os.path.join(trial.path, "stalled"), "w").close()
            time.sleep(3600)

class AtThree(tune.Stopper):
    def __call__(self, trial_id, result):
        return result["score"] < 0.5 and result["i"] >= 3
    def stop_all(self):
        return False

tune.init(num_cpus=2)
path = os.path.join(storage, name)
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, train)
elif mode == "asha":
    # The good trial first, then the bad one, which ASHA stops at its first rung (2).
    tuner = tune.Tuner(train, param_space={"score": tune.grid_search([1.0, 0.1])},
                       tune_config=tune.TuneConfig(
                           metric="score", mode="max", max_concurrent_trials=1,
                           scheduler=tune.schedulers.ASHAScheduler(
                               max_t=12, grace_period=2, reduction_factor=2)),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                 callbacks=[Stall()]))
else:
    tuner = tune.Tuner(train, param_space={"score": 0.1},
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                 stop=AtThree(), callbacks=[Stall()]))
results = tuner.fit()
print("DONE", sorted((r.config["score"], r.metrics["training_iteration"]) for r in results),
      results.num_terminated, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode,ended_by,at", [("stopper", "stopper", 3),
                                              ("asha", "scheduler", 2)])
def test_a_trial_the_driver_ended_is_not_run_again_after_a_driver_kill(tmp_path, mode,
                                                                       ended_by, at):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "ended"
    exp = os.path.join(storage, name)

    def life(stall: bool) -> contextlib.AbstractContextManager[subprocess.Popen]:
        env = dict(os.environ)
        env.pop("STALL", None)
        if stall:
            env["STALL"] = "1"
        return driver_life(script, [storage, name, mode],
                           tmp_path / f"driver-{int(stall)}.log", env)

    def stalled() -> list[str]:
        return glob.glob(os.path.join(exp, "*", "stalled"))

    with life(stall=True) as driver:
        wait_for(lambda: stalled() or driver.poll() is not None, timeout=120,
                 what="the driver to end the trial")
        assert driver.poll() is None, (tmp_path / "driver-1.log").read_text()[-3000:]
        # The driver decided the end and stalls before it saves it: kill it (its whole
        # process group, the embedded cluster with it).
        kill_driver(driver)
    trial_dir = os.path.dirname(stalled()[0])
    end = _marker(trial_dir)
    assert end is not None and end["ended_by"] == ended_by
    assert end["result"]["training_iteration"] == at
    if mode == "asha":
        assert end["rung"] == {"time_attr": "training_iteration", "value": at}
    with open(os.path.join(exp, "experiment_state.json")) as f:
        saved = {t["trial_id"]: t["status"] for t in json.load(f)["trials"]}
    ended_id = next(t for t in saved if t in os.path.basename(trial_dir))
    assert saved[ended_id] != "TERMINATED"  # the killed driver never saved its end

    with life(stall=False) as driver:
        driver.wait(180)
    out = (tmp_path / "driver-0.log").read_text()
    assert driver.returncode == 0, out[-3000:]
    want = "[(0.1, 2), (1.0, 12)] 2" if mode == "asha" else "[(0.1, 3)] 1"
    assert f"DONE {want}" in out, out[-3000:]
    with open(os.path.join(trial_dir, "runs.txt")) as f:
        assert f.read().splitlines() == ["run"]  # never run again
    with open(os.path.join(exp, "experiment_state.json")) as f:
        state = {t["trial_id"]: t for t in json.load(f)["trials"]}
    assert state[ended_id]["status"] == "TERMINATED"
    assert state[ended_id]["last_result"]["training_iteration"] == at
    if mode == "asha":  # the restored trial says why and where it stopped (the dashboard)
        assert state[ended_id]["stop_reason"] == "early_stopped"
        assert state[ended_id]["stop_rung"] == {"time_attr": "training_iteration", "value": at}
    with open(os.path.join(trial_dir, "result.json")) as f:
        its = [json.loads(line)["training_iteration"] for line in f if line.strip()]
    assert its == list(range(1, at + 1))
