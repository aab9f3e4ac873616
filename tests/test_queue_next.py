"""Successors queued behind running trials (``dasktune.executor.queue-next``).

With the FIFO scheduler and the default search, the driver queues each running trial's
successor on its actor, which starts it the moment the running one ends. What a user
must see is unchanged: every trial runs once, no more run at once than the cluster has
slots, a stopped experiment leaves the rest to a restore, and a trial stuck behind a
long one is taken back when another slot frees up.
"""

from __future__ import annotations

import json
import os
import time

import dask
import pytest

import dasktune as tune
from dasktune.callback import Callback
from dasktune.trial import RUNNING
from tests.conftest import wait_for


def _mark(config):
    """Each attempt leaves a file: (trial, start, end) on the shared local disk."""
    start = time.time()
    time.sleep(config["d"] if config["i"] != config.get("long_i") else config["long_d"])
    if config.get("fail_i") == config["i"]:
        raise RuntimeError(f"trial {config['i']} fails on purpose")
    end = time.time()
    path = os.path.join(config["dir"], f"{config['i']}-{start:.6f}.json")
    with open(path, "w") as f:
        json.dump({"i": config["i"], "start": start, "end": end}, f)
    tune.report({"score": config["i"], "end": end})


@pytest.fixture
def marks(tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    return str(folder)


def _runs(folder: str) -> list[dict]:
    return [json.load(open(os.path.join(folder, n))) for n in sorted(os.listdir(folder))]


class _MaxRunning(Callback):
    def __init__(self) -> None:
        self.max_running = 0

    def on_step_end(self, iteration, trials, **info):
        self.max_running = max(self.max_running, sum(t.status == RUNNING for t in trials))


def _tuner(space, storage_path, callbacks=(), **tc):
    return tune.Tuner(
        _mark, param_space=space,
        tune_config=tune.TuneConfig(num_samples=1, metric="score", mode="max", **tc),
        run_config=tune.RunConfig(storage_path=storage_path, name="q", verbose=0,
                                  callbacks=list(callbacks)),
    )


def test_every_trial_runs_once_within_the_slots(local_client, storage_path, marks):
    n = 40
    marker = _MaxRunning()
    space = {"i": tune.grid_search(list(range(n))), "d": 0.02, "dir": marks}
    results = _tuner(space, storage_path, [marker]).fit()
    assert results.num_terminated == n and not results.errors
    runs = _runs(marks)
    assert sorted(r["i"] for r in runs) == list(range(n))  # once each, none lost
    # Never more at once than the 2 slots, in the trials' own clocks...
    events = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    assert peak <= 2
    # ... and in the statuses a progress reporter shows.
    assert marker.max_running <= 2
    assert sorted(r.metrics["score"] for r in results) == list(range(n))


def test_a_trial_behind_a_long_one_moves_to_a_free_slot(local_client, storage_path,
                                                        marks):
    space = {"i": tune.grid_search(list(range(6))), "d": 0.05, "long_i": 0, "long_d": 4.0,
             "dir": marks}
    results = _tuner(space, storage_path).fit()
    assert results.num_terminated == 6
    runs = {r["i"]: r for r in _runs(marks)}
    long_end = runs[0]["end"]
    # Whatever was queued behind trial 0 was taken back and ran on the other slot.
    assert all(runs[i]["end"] < long_end for i in range(1, 6)), runs


def test_errors_and_retries_with_queued_successors(local_client, storage_path, marks):
    space = {"i": tune.grid_search(list(range(12))), "d": 0.02, "fail_i": 5,
             "dir": marks}
    tuner = tune.Tuner(
        _mark, param_space=space,
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(storage_path=storage_path, name="q", verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    results = tuner.fit()
    assert len(results.errors) == 1 and "fails on purpose" in str(results.errors[0])
    assert sorted(r["i"] for r in _runs(marks)) == [i for i in range(12) if i != 5]
    failed = [r for r in results if r.error]
    assert failed[0].config["i"] == 5


def test_time_budget_leaves_queued_trials_to_restore(local_client, storage_path, marks):
    space = {"i": tune.grid_search(list(range(60))), "d": 0.1, "dir": marks}
    results = _tuner(space, storage_path, time_budget_s=1.0).fit()
    done = {r.config["i"] for r in results if r.metrics.get("score") is not None}
    assert 0 < len(done) < 60
    path = results.experiment_path
    for _ in range(6):  # the restored experiment keeps its 1 s budget: restore until done
        restored = tune.Tuner.restore(path, _mark).fit()
        if restored.num_terminated == 60:
            break
    assert restored.num_terminated == 60 and not restored.errors
    counts: dict[int, int] = {}
    for r in _runs(marks):
        counts[r["i"]] = counts.get(r["i"], 0) + 1
    assert sorted(counts) == list(range(60))
    # A trial taken back while starting may have run twice (stopped, then rerun); never
    # more, and never one that finished before the stop.
    assert all(c <= 2 for c in counts.values())
    assert all(counts[i] == 1 for i in done)


@pytest.mark.parametrize("setting", [False, True])
def test_setting_turns_it_off(local_client, storage_path, marks, setting):
    from dasktune.driver.queue_ahead import QueueLines

    seen = {}
    real = QueueLines.fill

    def spy(self):
        seen["called"] = True
        return real(self)

    space = {"i": tune.grid_search(list(range(6))), "d": 0.02, "dir": marks}
    QueueLines.fill = spy
    try:
        with dask.config.set({"dasktune.executor.queue-next": setting}):
            results = _tuner(space, storage_path).fit()
    finally:
        QueueLines.fill = real
    assert results.num_terminated == 6
    assert seen.get("called", False) is setting


def test_a_line_of_queued_attempts_runs_in_one_thread(local_client, tmp_path):
    """On a real worker's actor: queued attempts start, in line order, as the one
    before returns, even when two end before the driver polls either; each ended
    attempt's reports still reach its own poll, and calls meant for an ended attempt
    (a late stop, an enqueue behind it) miss the one that took over the actor."""
    import cloudpickle

    from dasktune.actor import TrialActor
    from dasktune.session import TrialSpec
    from dasktune.storage import ExperimentStorage

    def gated(config):
        for i in range(config["n"]):
            tune.report({"i": i})
        deadline = time.monotonic() + 30
        while not os.path.exists(config["gate"]) and time.monotonic() < deadline:
            time.sleep(0.005)
        tune.report({"i": config["n"]})

    storage = ExperimentStorage(str(tmp_path / "results"), "exp")

    def spec(tid):
        return TrialSpec(trial_id=tid, trial_name=tid, experiment_name="exp",
                         config={"n": 3, "gate": str(tmp_path / f"gate-{tid}")},
                         trainable=cloudpickle.dumps(gated), storage=storage,
                         trial_path=storage.trial_path(tid))

    worker = sorted(local_client.scheduler_info()["workers"])[0]
    future = local_client.submit(TrialActor, spec("a"), actor=True, workers=[worker],
                                 pure=False)

    def call(method, *args):  # as the executor calls actors: one RPC to the worker
        from distributed.protocol import to_serialize

        async def go():
            resp = await local_client.rpc(worker).actor_execute(
                actor=future.key, function=method, args=[to_serialize(a) for a in args],
                kwargs={})
            if resp["status"] != "OK":
                raise resp["exception"]
            return resp["result"]

        return local_client.sync(go, callback_timeout=30)

    def drain(attempt):
        got, ack, reply = [], 0, {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = call("poll", ack, 0.2, attempt)
            got += [r["i"] for _, r, _ in reply["reports"]]
            if reply["reports"]:
                ack = reply["reports"][-1][0]
            if reply["finished"]:
                break
        return got, reply

    try:
        future.result(timeout=30)
        where = call("start")
        assert call("enqueue", spec("b"), "a:1") is True
        assert call("enqueue", spec("c"), "a:1") is False  # not the last in line
        assert call("enqueue", spec("c"), "b:1") is True
        (tmp_path / "gate-a").touch()
        (tmp_path / "gate-b").touch()
        # c runs once its first reports show: a's thread went on to b, then to c.
        wait_for(lambda: call("poll", 0, 0.0, "c:1")["reports"],
                 what="the last queued attempt's first report")
        assert call("poll", 0, 0.0, "x:1")["gone"]  # an attempt it never held
        call("stop", False, "a:1")  # late: a and b have ended
        call("stop", False, "b:1")
        for ended in ("a:1", "b:1"):
            got, reply = drain(ended)
            assert got == [0, 1, 2, 3]
            assert reply["error"] is None
            assert reply["next"]["worker"] == where["worker"]

        (tmp_path / "gate-c").touch()
        got, reply = drain("c:1")
        assert got == [0, 1, 2, 3]  # c ran to its end: the stops for a and b missed it
        assert reply["finished"] and "next" not in reply
    finally:
        future.release()
