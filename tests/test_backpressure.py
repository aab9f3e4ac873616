"""A driver slower than its trials holds a bounded backlog, and loses nothing.

Trials that report faster than the driver takes results must not pile batches up in the
driver (its memory would grow with the report count): the driver fetches a trial's next
batch only once it has taken the last one, so the reports wait in the trial actor's
bounded buffer and, past it, ``tune.report`` blocks the trial.
"""

from __future__ import annotations

import time

import pytest

import dasktune as tune
from dasktune.callback import Callback

REPORTS = 3000


def _chatty(config):
    for i in range(REPORTS):
        tune.report({"loss": 1.0 / (i + 1), "i": i})


class _SlowDriver(Callback):
    """Takes 1 ms per result (a heavy callback) and samples the driver's event backlog."""

    def __init__(self) -> None:
        self.executor = None
        self.most_waiting = 0
        self.seen: dict[str, list[int]] = {}

    def setup(self, *args, controller=None, **info) -> None:
        self.executor = controller.executor

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.seen.setdefault(trial.trial_id, []).append(result["i"])
        self.most_waiting = max(self.most_waiting, self.executor._events.qsize())
        time.sleep(0.001)


@pytest.mark.slow
def test_a_slow_driver_holds_one_batch_per_trial_and_loses_nothing(local_client, tmp_path):
    slow = _SlowDriver()
    results = tune.Tuner(
        tune.with_resources(_chatty, {"cpu": 0.01}),
        param_space={"x": tune.grid_search([1, 2, 3, 4])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0, callbacks=[slow]),
    ).fit()
    assert results.num_errors == 0
    # Every report arrived, in order (the slow driver lost none).
    assert sorted(slow.seen) == sorted(r.metrics["trial_id"] for r in results)
    assert all(seen == list(range(REPORTS)) for seen in slow.seen.values())
    # At most one undelivered batch per trial, plus each trial's end: without the
    # backpressure, the trials' 12,000 reports arrive as dozens of queued batches.
    assert slow.most_waiting <= 2 * 4, slow.most_waiting
