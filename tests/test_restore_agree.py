"""Result files agree after any kill, and ``num_to_keep`` holds across restores (issue 24).

- A driver SIGKILLed (its whole process group, the embedded cluster with it) at seeded
  random moments, restored each time: every trial's ``result.json``, ``progress.csv``,
  TensorBoard scalars and ``Result.metrics_dataframe`` hold each iteration the trial
  reported exactly once, in order; while a restored driver runs, no trial folder holds
  more than ``num_to_keep`` checkpoints plus the one being written.
- A killed driver's leftovers made by hand, each kind at once (a torn last line, a CSV
  that lags, event files that run ahead, a committed checkpoint whose result no driver
  logged, a torn checkpoint, the folder of a trial the state never saw): restore makes
  the files agree, and the unlogged result reaches the user's callbacks.
- The record's rule on its own: the rows after the one the state saw last are what was
  logged after the save (a pending PBT exploit's count goes back and stays).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile

import pytest
from conftest import driver_lives, logged_iterations, logged_rows

import dasktune as tune
from dasktune.driver.restore import restore_trials
from dasktune.layout import checkpoint_dir_name
from dasktune.storage import MANIFEST, TRIAL_END_FILE, ExperimentStorage
from dasktune.trial import Trial

DRIVER = r'''
import json, os, sys, tempfile, time
import dasktune as tune

storage, name = sys.argv[1:3]

def train(config):
    ctx = tune.get_context()
    d, attempt = ctx.get_trial_dir(), ctx.get_attempt()
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as c, open(os.path.join(c, "s.json")) as f:
            start = json.load(f)["i"]
    for i in range(start + 1, config["iters"] + 1):
        time.sleep(config["sleep"])
        with open(os.path.join(d, "executed.jsonl"), "a") as f:
            f.write(json.dumps({"attempt": attempt, "it": i}) + "\n")
        ck = None
        if i % 2 == 0:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "s.json"), "w") as f:
                json.dump({"i": i}, f)
            ck = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i, "attempt": attempt}, checkpoint=ck)

tune.init(num_cpus=2)
path = os.path.join(storage, name)
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, train)
else:
    tuner = tune.Tuner(train, param_space={"x": tune.grid_search(list(range(4))), "iters": 12,
                                           "sleep": 0.1},
                       run_config=tune.RunConfig(
                           name=name, storage_path=storage, verbose=0,
                           checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
results = tuner.fit()
print("DONE", len(results), results.num_terminated, len(results.errors), flush=True)
'''


def _trial_dirs(exp: str) -> list[str]:
    return sorted(os.path.join(exp, d) for d in os.listdir(exp)
                  if os.path.isdir(os.path.join(exp, d)))


def _frames(exp: str) -> dict[str, list[int]]:
    """Each trial folder's ``Result.metrics_dataframe`` iterations."""
    analysis = tune.ExperimentAnalysis(exp)
    return {t.path: list(analysis.trial_dataframes[t.trial_id]["training_iteration"])
            for t in analysis.trials}


@pytest.mark.slow
def test_files_agree_after_kills_at_random_points(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage, name = str(tmp_path / "results"), "agree"
    exp = os.path.join(storage, name)
    crowded: list[tuple[int, str, list[str]]] = []

    def at_most_k_plus_one(life: int) -> None:
        """While a restored driver runs: at most num_to_keep=2 checkpoint folders per
        trial, plus the one being written."""
        if life == 1:
            return
        for d in _trial_dirs(exp):
            folders = [n for n in os.listdir(d) if n.startswith("checkpoint_")]
            if len(folders) > 3:
                crowded.append((life, d, folders))

    lives, kills, out = driver_lives(script, [storage, name], tmp_path,
                                     progress=lambda: logged_rows(exp), rng=random.Random(24),
                                     kills=3, step=(3, 9), jitter=0.4,
                                     before_kill=at_most_k_plus_one)
    assert "DONE 4 4 0" in out, out[-3000:]
    assert kills == 3 and not crowded, crowded
    frames = _frames(exp)
    assert len(frames) == 4
    for d in _trial_dirs(exp):
        files = logged_iterations(d, "ray/tune/i")
        checkpoints = files.pop("checkpoints")
        files["metrics_dataframe"] = frames[d]
        with open(os.path.join(d, "executed.jsonl")) as f:
            executed = [json.loads(line) for line in f]
        # The trial's own sequence: every iteration it reported, 1 to 12.
        assert sorted({e["it"] for e in executed}) == list(range(1, 13))
        for what, its in files.items():
            assert its == list(range(1, 13)), (d, what, its)
        # Each logged row is one an attempt of the trial really reported.
        with open(os.path.join(d, "result.json")) as f:
            for row in map(json.loads, f):
                assert {"attempt": row["attempt"], "it": row["i"]} in executed, row
                assert row["i"] == row["training_iteration"]
        assert checkpoints == [10, 12], (d, checkpoints)
        assert len([n for n in os.listdir(d) if n.startswith("checkpoint_")]) == 2


# ------------------------------------------------------------- by hand
def counting(config):
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as c, open(os.path.join(c, "s.json")) as f:
            start = json.load(f)["i"]
    for i in range(start + 1, 7):
        ck = None
        if i % 2 == 0:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "s.json"), "w") as f:
                json.dump({"i": i}, f)
            ck = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i, "resumed_from": start}, checkpoint=ck)


class Seen(tune.Callback):
    """A user's callback (saved with the experiment, so the restored run has it too):
    writes down what it is told."""

    def __init__(self, path: str):
        self.path = path

    def _write(self, **entry) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def on_trial_restore_results(self, iteration, trials, trial, results, **info):
        self._write(rewritten=[r["training_iteration"] for r in results])

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._write(result=result["training_iteration"], config=result.get("config"))


def _keep_lines(path: str, n: int, tail: str = "") -> None:
    with open(path) as f:
        lines = f.readlines()
    with open(path, "w") as f:
        f.writelines(lines[:n])
        f.write(tail)


def test_restore_makes_a_killed_drivers_leftovers_agree(local_client, tmp_path):
    seen = tmp_path / "seen.jsonl"
    first = tune.Tuner(counting, param_space={"a": 1}, run_config=tune.RunConfig(
        name="left", storage_path=str(tmp_path), verbose=0,
        callbacks=[Seen(str(seen))])).fit()
    d = first[0].path
    exp = os.path.dirname(d)
    # What a driver killed after iteration 3 may leave (each kind at once): the state
    # saved at iteration 2, result.json with 3 rows and a torn 4th, progress.csv with 2,
    # event files with all 6, checkpoint it=4 committed but never logged, checkpoint
    # it=6 torn, no end marker yet, and the folder of a trial it made after its save.
    state_path = os.path.join(exp, "experiment_state.json")
    with open(state_path) as f:
        state = json.load(f)
    (trial,) = state["trials"]
    ckpt2 = next(c for c in trial["checkpoints"] if c["iteration"] == 2)
    with open(os.path.join(d, "result.json")) as f:
        rows = [json.loads(line) for line in f]
    trial.update(status="RUNNING", logged_iteration=2, checkpoints=[ckpt2],
                 checkpoint=ckpt2["path"], checkpoint_iteration=2, last_result=rows[1])
    with open(state_path, "w") as f:
        json.dump(state, f)
    _keep_lines(os.path.join(d, "result.json"), 3, tail='{"i": 4, "training_it')
    _keep_lines(os.path.join(d, "progress.csv"), 3)  # header + 2 rows
    os.remove(os.path.join(d, TRIAL_END_FILE))
    os.remove(os.path.join(d, checkpoint_dir_name(2), MANIFEST))
    stale = os.path.join(exp, "counting_unknown_00001")
    os.makedirs(os.path.join(stale, "checkpoint_000000"))
    with open(os.path.join(stale, "params.json"), "w") as f:
        f.write("{}")

    seen.unlink()
    results = tune.Tuner.restore(exp, counting).fit()
    assert results.num_terminated == 1 and not results.errors
    # The record was rows 1-3; row 4 came from checkpoint it=4's manifest, through the
    # callbacks; the trial resumed from that checkpoint and reported 5 and 6.
    told = [json.loads(line) for line in seen.read_text().splitlines()]
    assert told[0] == {"rewritten": [1, 2, 3]}
    assert [e["result"] for e in told[1:]] == [4, 5, 6]
    assert all(e["config"] == {"a": 1} for e in told[1:])
    assert results[0].metrics["resumed_from"] == 4
    files = logged_iterations(d, "ray/tune/i")
    assert files.pop("checkpoints") == [2, 4, 6]
    files["metrics_dataframe"] = list(results[0].metrics_dataframe["training_iteration"])
    for what, its in files.items():
        assert its == [1, 2, 3, 4, 5, 6], (what, its)
    assert len([n for n in os.listdir(d) if n.startswith("events.out.tfevents.")]) == 1
    assert not os.path.exists(stale)
    # The torn checkpoint was deleted; the new lineage did not reuse its name.
    assert sorted(n for n in os.listdir(d) if n.startswith("checkpoint_")) == [
        "checkpoint_000000", "checkpoint_000001", "checkpoint_000003"]


def test_restart_errored_starts_its_files_and_checkpoints_afresh(local_client, tmp_path):
    marker = tmp_path / "fail"
    marker.write_text("")

    def flaky(config):
        for i in range(1, 4):
            tmp = tempfile.mkdtemp()
            tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(tmp))
            shutil.rmtree(tmp, ignore_errors=True)
            if i == 2 and os.path.exists(config["marker"]):
                raise RuntimeError("boom")

    first = tune.Tuner(flaky, param_space={"marker": str(marker)}, run_config=tune.RunConfig(
        name="again", storage_path=str(tmp_path), verbose=0)).fit()
    assert len(first.errors) == 1
    marker.unlink()
    results = tune.Tuner.restore(os.path.dirname(first[0].path), flaky,
                                 restart_errored=True).fit()
    assert not results.errors
    files = logged_iterations(results[0].path, "ray/tune/i")
    assert files.pop("checkpoints") == [1, 2, 3]  # the errored attempt's are gone
    for what, its in files.items():
        assert its == [1, 2, 3], (what, its)


# ------------------------------------------------------------- the record's rule
def _folder_with_rows(tmp_path, its: list[int]):
    storage = ExperimentStorage(str(tmp_path / "results"), "exp")
    path = storage.trial_path("train_t0")
    os.makedirs(path)
    rows = [{"training_iteration": it, "time_total_s": float(n), "timestamp": 1000 + n,
             "config": {}} for n, it in enumerate(its)]
    with open(os.path.join(path, "result.json"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return storage, path, rows


def _saved(path: str, last: dict, logged: int, **fields) -> Trial:
    trial = Trial(trial_id="t0", config={}, status="PENDING", **fields)
    trial.path, trial.last_result, trial.logged_iteration = path, dict(last), logged
    return trial


def test_the_record_is_the_rows_after_the_one_the_state_saw(tmp_path):
    # Rows 1-8, then a PBT exploit from a donor at iteration 4: the state saved after
    # the exploit counts 4 and saw row 8 last. Nothing was logged since: the count stays.
    storage, path, rows = _folder_with_rows(tmp_path, [1, 2, 3, 4, 5, 6, 7, 8])
    trial = _saved(path, rows[-1], 4, restore_path="/donor/checkpoint_000001")
    (rec,) = restore_trials([trial], storage).recoveries
    assert trial.logged_iteration == 4 and trial.last_result == rows[-1]
    assert [r["training_iteration"] for r in rec.results] == [1, 2, 3, 4, 5, 6, 7, 8]
    # The exploited attempt logged 5 and 6 before the kill: the count goes on from them.
    storage, path, rows = _folder_with_rows(tmp_path / "b", [1, 2, 3, 4, 5, 6, 7, 8, 5, 6])
    trial = _saved(path, rows[7], 4, restore_path="/donor/checkpoint_000001")
    restore_trials([trial], storage)
    assert trial.logged_iteration == 6 and trial.last_result == rows[-1]
    # The row the state saw never reached the file: the count is the file's.
    storage, path, rows = _folder_with_rows(tmp_path / "c", [1, 2, 3])
    trial = _saved(path, dict(rows[-1], training_iteration=4, timestamp=2000), 4)
    restore_trials([trial], storage)
    assert trial.logged_iteration == 3 and trial.last_result == rows[-1]
