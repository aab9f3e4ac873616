"""A driver slower than its trials holds a bounded backlog, and loses nothing.

Trials that report faster than the driver takes results must not pile batches up in the
driver (its memory would grow with the report count): the driver fetches a trial's next
batch only once it has taken the last one, so the reports wait in the trial actor's
bounded buffer and, past it, ``tune.report`` blocks the trial.
"""

from __future__ import annotations

import time

import dask
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


class _HeldCounter(Callback):
    """Counts the reports the driver holds: fetched from the trials, not yet taken."""

    def __init__(self) -> None:
        self.fetched = 0
        self.taken = 0
        self.most_held = 0
        self.seen: dict[str, list[int]] = {}

    def setup(self, *args, controller=None, **info) -> None:
        executor = controller.executor
        call = executor._call

        async def counting_call(run, method, *a, **kw):
            reply = await call(run, method, *a, **kw)
            if method == "poll":
                self.fetched += len(reply.get("reports", ()))
                self.most_held = max(self.most_held, self.fetched - self.taken)
            return reply

        executor._call = counting_call

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.taken += 1
        self.seen.setdefault(trial.trial_id, []).append(result["i"])
        time.sleep(0.0005)  # a driver slower than its trials


def _chatty_n(config):
    for i in range(config["n"]):
        tune.report({"loss": 1.0 / (i + 1), "i": i})


@pytest.mark.slow
def test_the_trials_share_the_drivers_in_flight_budget(local_client, tmp_path):
    """More trials do not mean more reports held: each poll fetches its share of
    ``executor.max-reports-in-flight`` (here 600 among 6 trials), so the driver holds
    about one budget being processed and one fetched."""
    counter = _HeldCounter()
    with dask.config.set({"dasktune.executor.max-reports-in-flight": 600}):
        results = tune.Tuner(
            tune.with_resources(_chatty_n, {"cpu": 0.01}),
            param_space={"n": 1500, "x": tune.grid_search(list(range(6)))},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0,
                                      callbacks=[counter]),
        ).fit()
    assert results.num_errors == 0
    assert len(counter.seen) == 6
    assert all(seen == list(range(1500)) for seen in counter.seen.values())
    # A share fetched per trial while its last is processed: about twice the budget (the
    # shares grow as trials end, so a little more), where 1,000-report batches held 8,100.
    assert counter.most_held < 3 * 600, counter.most_held
