"""A trial's ``error.txt`` comes through the callbacks, as every other trial file does.

The real driver loop on the simulated executor (no Dask needed: the driver's side is
what is checked). A user's own LoggerCallback hears of each failure in Ray's hooks
(``on_trial_recover``, then ``on_trial_error``) and finds, there and then, the
``error.txt`` that Ray's layout puts in the trial's folder, with one block per failure.
"""

from __future__ import annotations

import os

from dasktune.config import FailureConfig, RunConfig, TuneConfig
from dasktune.logger import LoggerCallback
from dasktune.simulator import SimulatedExecutor, run_simulated


class SeesErrors(LoggerCallback):
    """What a user's logger sees at each failure hook: the hook, the trial's failure
    count, its error file and that file's blocks."""

    def __init__(self):
        self.seen = []

    def _see(self, hook, trial):
        blocks = None
        if trial.error_file is not None:
            with open(trial.error_file) as f:
                blocks = f.read().count("Failure # ")
        self.seen.append((hook, trial.num_failures, trial.error_file, blocks,
                          trial.error_msg))

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._see("recover", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._see("error", trial)


def ten_seconds(config, trial_id):
    return [(1.0, {"i": i}) for i in range(10)]


def test_a_users_logger_sees_each_failure_in_error_txt(tmp_path):
    seen = SeesErrors()
    rc = RunConfig(name="e", storage_path=str(tmp_path), stop={"missing": 1},
                   failure_config=FailureConfig(max_failures=2), callbacks=[seen])
    results = run_simulated("f", {"x": 1}, TuneConfig(), rc,
                            executor=SimulatedExecutor(1, trial_model=ten_seconds))
    (trial,) = results._trials
    # Where Ray puts it: <storage>/<experiment>/<trainable>_<trial>/error.txt
    path = os.path.join(str(tmp_path), "e", f"f_{trial.dirname}", "error.txt")
    assert trial.error_file == path and trial.path == os.path.dirname(path)
    assert [s[:4] for s in seen.seen] == [("recover", 1, path, 1), ("recover", 2, path, 2),
                                          ("error", 3, path, 3)]
    assert all("stop criterion 'missing'" in s[4] for s in seen.seen)
    with open(path) as f:
        text = f.read()
    assert [line.split(" (")[0] for line in text.splitlines()
            if line.startswith("Failure # ")] == ["Failure # 1", "Failure # 2", "Failure # 3"]
    assert text.count("stop criterion 'missing' is not in the reported result") == 3


def test_a_lost_worker_is_no_failure_but_the_loss_too_many_is(tmp_path):
    seen = SeesErrors()
    rc = RunConfig(name="e", storage_path=str(tmp_path), callbacks=[seen],
                   failure_config=FailureConfig(max_worker_losses=1))
    ex = SimulatedExecutor(2, trial_model=ten_seconds)
    # The trial starts on worker 0, moves to worker 1 (the only one left) after the first
    # loss, and the second loss is one too many.
    ex.kill_workers(["sim://worker-0000"], at=2.5)
    ex.kill_workers(["sim://worker-0001"], at=5.5)
    results = run_simulated("f", {"x": 1}, TuneConfig(), rc, executor=ex)
    (trial,) = results._trials
    path = os.path.join(str(tmp_path), "e", f"f_{trial.dirname}", "error.txt")
    assert [s[:4] for s in seen.seen] == [("recover", 0, None, None), ("error", 0, path, 1)]
    with open(path) as f:
        text = f.read()
    assert text.startswith("Failure # 0 (occurred at ")
    assert "lost its worker 2 times (FailureConfig.max_worker_losses=1)" in text
