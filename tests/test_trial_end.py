"""A finished trial is never run again (issue 24): the worker records the trial's end.

The attempt writes a trial-end marker (its final result) to the trial's folder before it
reports its end; ``Tuner.restore`` counts a trial with that marker as TERMINATED even
when the killed driver never saved its end.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import subprocess

import pytest
from conftest import driver_life, kill_driver, wait_for

from dasktune.attempt import Attempt
from dasktune.session import TrialSpec
from dasktune.storage import TRIAL_END_FILE, ExperimentStorage


def _attempt(tmp_path, trainable, stop=None):
    storage = ExperimentStorage(str(tmp_path / "results"), "exp")
    trial_path = storage.trial_path("t0")
    spec = TrialSpec(trial_id="t0", trial_name="t0", experiment_name="exp", config={},
                     trainable=trainable, storage=storage, trial_path=trial_path,
                     attempt=2, stop=stop)
    emitted: list = []
    return Attempt(spec, {}, lambda r, p: emitted.append(r)), storage, trial_path


def test_a_returned_trainable_leaves_its_final_result_in_storage(tmp_path):
    def train(config):
        for i in range(3):
            __import__("dasktune").report({"loss": 10 - i})

    attempt, storage, trial_path = _attempt(tmp_path, train)
    assert storage.read_trial_end(trial_path) is None
    error, _ = attempt.run("tcp://127.0.0.1:1")
    assert error is None
    end = storage.read_trial_end(trial_path)
    assert end["attempt"] == 2 and end["training_iteration"] == 3
    assert end["result"]["loss"] == 8 and end["result"]["training_iteration"] == 3
    assert "config" not in end["result"]


def test_the_stop_dict_ends_a_trial_too(tmp_path):
    def train(config):
        for i in range(100):
            __import__("dasktune").report({"i": i})

    attempt, storage, trial_path = _attempt(tmp_path, train, stop={"training_iteration": 4})
    assert attempt.run("w")[0] is None
    assert storage.read_trial_end(trial_path)["training_iteration"] == 4


def test_no_end_is_recorded_for_an_error_a_driver_stop_or_a_fenced_attempt(tmp_path):
    def fails(config):
        __import__("dasktune").report({"i": 1})
        raise RuntimeError("boom")

    attempt, storage, trial_path = _attempt(tmp_path / "a", fails)
    assert "boom" in attempt.run("w")[0]
    assert storage.read_trial_end(trial_path) is None

    def forever(config):
        while True:
            __import__("dasktune").report({"i": 1})

    for how in ("stop", "fence"):
        attempt, storage, trial_path = _attempt(tmp_path / how, forever)
        attempt.request_stop() if how == "stop" else attempt.fence("gone")
        assert attempt.run("w")[0] is None
        assert storage.read_trial_end(trial_path) is None, how


def test_a_broken_marker_does_not_count(tmp_path):
    storage = ExperimentStorage(str(tmp_path / "results"), "exp")
    trial_path = storage.trial_path("t0")
    storage.makedirs(trial_path)
    with open(os.path.join(trial_path, TRIAL_END_FILE), "w") as f:
        f.write('{"attempt": 1, "resu')  # never happens (atomic), but must not crash
    assert storage.read_trial_end(trial_path) is None


DRIVER = r'''
import os, sys, time
import dasktune as tune

storage, name = sys.argv[1:3]

def train(config):
    d = tune.get_context().get_trial_dir()
    with open(os.path.join(d, "runs.txt"), "a") as f:
        f.write("run\n")
    for i in range(1, config["iters"] + 1):
        time.sleep(config["sleep"])
        tune.report({"i": i})
    open(os.path.join(d, "returning"), "w").close()

class Stall(tune.Callback):
    """The driver stalls before it records the short trial's end, as a driver killed in
    that second would (only in the first life: STALL is not set for the restore)."""
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if os.environ.get("STALL") and result["training_iteration"] == 2:
            time.sleep(3600)

class Two(tune.search.Searcher):
    """The short trial, then the long one."""
    def __init__(self):
        super().__init__()
        self.n = 0
    def suggest(self, trial_id):
        self.n += 1
        return {"iters": 2 if self.n == 1 else 12, "sleep": 0.1}
    def get_state(self):
        return {"n": self.n}
    def set_state(self, state):
        self.n = state["n"]

tune.init(num_cpus=2)
path = os.path.join(storage, name)
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, train)
else:
    # One trial at a time: the long one is suggested only once the searcher hears that the
    # short one completed, which the killed driver never told it.
    limited = tune.search.ConcurrencyLimiter(Two(), max_concurrent=1)
    tuner = tune.Tuner(train, tune_config=tune.TuneConfig(search_alg=limited, num_samples=2),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                                 callbacks=[Stall()]))
results = tuner.fit()
print("DONE", sorted((r.config["iters"], r.metrics["training_iteration"]) for r in results),
      results.num_terminated, flush=True)
'''


@pytest.mark.slow
def test_a_trial_that_returned_is_not_run_again_after_a_driver_kill(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "ended"
    exp = os.path.join(storage, name)

    def life(stall: bool) -> contextlib.AbstractContextManager[subprocess.Popen]:
        env = dict(os.environ)
        env.pop("STALL", None)
        if stall:
            env["STALL"] = "1"
        return driver_life(script, [storage, name], tmp_path / f"driver-{int(stall)}.log",
                           env)

    def returned() -> list[str]:
        return glob.glob(os.path.join(exp, "*", "returning"))

    with life(stall=True) as driver:
        # The short trial's trainable returned; its end is durable: kill the driver (its
        # whole process group, the embedded cluster with it) at once.
        wait_for(lambda: returned() or driver.poll() is not None, timeout=120,
                 what="the short trial's trainable to return")
        assert driver.poll() is None, (tmp_path / "driver-1.log").read_text()[-3000:]
        trial_dir = os.path.dirname(returned()[0])
        wait_for(lambda: os.path.exists(os.path.join(trial_dir, TRIAL_END_FILE)), timeout=30,
                 what="the trial's end in storage")
        kill_driver(driver)
    with open(os.path.join(exp, "experiment_state.json")) as f:
        saved = {t["trial_id"]: t["status"] for t in json.load(f)["trials"]}
    short_id = next(t for t in saved if t in os.path.basename(trial_dir))
    assert saved[short_id] != "TERMINATED"  # the killed driver never saved its end

    with life(stall=False) as driver:
        driver.wait(180)
    out = (tmp_path / "driver-0.log").read_text()
    assert driver.returncode == 0, out[-3000:]
    assert "DONE [(2, 2), (12, 12)] 2" in out, out[-3000:]
    with open(os.path.join(trial_dir, "runs.txt")) as f:
        assert f.read().splitlines() == ["run"]  # its trainable ran once
    with open(os.path.join(exp, "experiment_state.json")) as f:
        state = {t["trial_id"]: t for t in json.load(f)["trials"]}
    assert state[short_id]["status"] == "TERMINATED"
    with open(os.path.join(trial_dir, "result.json")) as f:
        its = [json.loads(line)["training_iteration"] for line in f if line.strip()]
    assert its == [1, 2]
