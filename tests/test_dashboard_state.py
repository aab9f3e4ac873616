"""The dashboard's pure parts: redaction, message building, the bounded state."""

from __future__ import annotations

import json
import math
import pickle
import random

import pytest

from dasktune.dashboard._callback import DashboardCallback
from dasktune.dashboard._messages import experiment_message, result_point, trial_record
from dasktune.dashboard._plugin import DasktuneDashboardPlugin
from dasktune.dashboard._redact import is_secret_key, jsonable, strip_uri
from dasktune.dashboard._state import DashboardState
from dasktune.driver import TuneController
from dasktune.trial import Placement, Trial


def test_secret_keys_and_uris_are_masked():
    assert is_secret_key("api_key") and is_secret_key("AWS_SECRET_ACCESS_KEY")
    assert is_secret_key("authToken") and is_secret_key("db-password")
    assert not is_secret_key("keyboard") and not is_secret_key("lr")
    config = {"lr": 0.1, "nested": {"password": "hunter2", "url": "s3://AKIA:SK@bucket/x"},
              "shape": (3, 4), "bad": float("nan"), "obj": object()}
    safe = jsonable(config)
    text = json.dumps(safe, allow_nan=False)
    assert "hunter2" not in text and "AKIA" not in text and "SK@" not in text
    assert safe["nested"]["password"] == "***"
    assert safe["shape"] == [3, 4] and safe["bad"] is None
    assert safe["obj"].startswith("<object")
    assert strip_uri("gs://user:pw@b/p?token=abc&x=1") == "gs://b/p?token=***&x=1"


def test_trial_record_uses_trial_fields():
    trial = Trial("t1", {"lr": 0.5, "secret": "s"})
    trial.set_status("RUNNING")
    trial.placements.append(Placement(1, "tcp://10.0.0.1:1", "h1", 1.0, 2.0, "lost"))
    trial.placements.append(Placement(2, "tcp://10.0.0.2:1", "h2", 3.0))
    trial.num_restarts = 1
    for i, loss in enumerate([0.5, 0.2, 0.3], start=1):
        trial.update_last_result({"training_iteration": i, "loss": loss})
    record = trial_record(trial, "loss", "min")
    assert record["iteration"] == 3 and record["last"] == 0.3 and record["best"] == 0.2
    assert trial_record(trial, "loss", "max")["best"] == 0.5
    assert (record["worker"], record["host"], record["restarts"]) == ("tcp://10.0.0.2:1", "h2", 1)
    assert record["config"] == {"lr": 0.5, "secret": "***"}
    assert [p["outcome"] for p in record["placements"]] == ["lost", None]
    assert result_point("t1", {"training_iteration": 2, "loss": 1}, "loss", 5.0) == [
        "t1", 2, 1.0, 5.0]
    assert result_point("t1", {"training_iteration": 2, "loss": math.nan}, "loss", 5.0) is None
    msg = experiment_message("e", {"storage": "s3://a:b@c/d", "searcher": Trial},
                             status="RUNNING")
    assert msg["storage"] == "s3://c/d" and msg["searcher"] == "Trial"


def test_trials_stopped_below_the_furthest_iteration_are_stopped_early():
    """The scheduler's STOP (stop_reason "early_stopped") below the furthest iteration
    any trial reached is an early stop; a STOP at that bound (ASHA's max_t) and a trial
    whose trainable returned are not."""
    trials = {name: Trial(name, {}) for name in ("pruned", "at_max_t", "returned", "queued")}
    for name, n in (("pruned", 3), ("at_max_t", 9), ("returned", 9)):
        for i in range(1, n + 1):
            trials[name].update_last_result({"training_iteration": i, "loss": 1.0 / i})
    for name in ("pruned", "at_max_t", "queued"):
        trials[name].stop_reason = "early_stopped"
    for trial in trials.values():
        trial.set_status("TERMINATED")
    state = DashboardState()
    state.apply({"type": "trials", "experiment_id": "e",
                 "trials": [trial_record(t, "loss", "min") for t in trials.values()]})
    got = {r["trial_id"]: (r["stopped_early"], r["status_detail"]) for r in state.trials("e")}
    assert got == {"pruned": (True, "stopped early at iteration 3 of 9"),
                   "at_max_t": (False, None), "returned": (False, None),
                   "queued": (True, "stopped before its first result")}


def test_state_bounds_points_and_tracks_best():
    state = DashboardState(max_points=100)
    state.apply({"type": "experiment", "experiment_id": "e", "name": "e", "metric": "m",
                 "mode": "max", "start_time": 0.0, "status": "RUNNING"})
    points = [["a", i, float(i), float(i)] for i in range(1, 1001)]
    state.apply({"type": "results", "experiment_id": "e", "points": points})
    view = state.snapshot("e")
    series = view.points["a"]
    assert len(series) <= 100 and series[0][0] == 1 and series[-1][0] == 1000
    assert view.best_so_far[-1][:2] == [1000.0, 1000.0] and len(view.best_so_far) <= 100
    # A restore re-reports iterations: the curve follows the attempt that counts.
    state.apply({"type": "results", "experiment_id": "e", "points": [["a", 999, -1.0, 2e3]]})
    assert state.snapshot("e").points["a"][-1] == [999, -1.0, 2e3]
    assert [e["experiment_id"] for e in state.experiments()] == ["e"]


def test_state_evicts_oldest_finished_experiment():
    state = DashboardState(max_experiments=2)
    for i, status in enumerate(["FINISHED", "RUNNING", "RUNNING"]):
        state.apply({"type": "experiment", "experiment_id": f"e{i}", "status": status,
                     "start_time": float(i)})
    assert sorted(state.experiment_ids()) == ["e1", "e2"]


@pytest.mark.parametrize("msg, match", [
    ("nope", "must be a dict"),
    ({"type": "trials"}, "without experiment_id"),
    ({"type": "what", "experiment_id": "e"}, "unknown .* type 'what'"),
    ({"type": "trials", "experiment_id": "e", "trials": "x"}, "needs a list"),
    ({"type": "results", "experiment_id": "e", "points": [["a", 1]]}, r"\[trial, iter"),
    ({"type": "results", "experiment_id": "e", "points": [["a", "1", 2, 3]]}, "numbers"),
])
def test_bad_messages_raise_value_error(msg, match):
    with pytest.raises(ValueError, match=match):
        DashboardState().apply(msg)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="max_points"):
        DashboardState(max_points=1)
    with pytest.raises(ValueError, match="max_experiments"):
        DashboardState(max_experiments=0)


class _Events:
    """Stands in for ``Client.log_event``: keeps what the callback sends."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def log_event(self, topic: str, msg: dict) -> None:
        self.messages.append(json.loads(json.dumps(msg)))  # plain types, as on the wire


class _Driver:
    """The controller's waiting state, read through its real ``status_line``."""

    status_line = TuneController.status_line

    def __init__(self) -> None:
        self._waiting_reason: str | None = None
        self._waiting_trial: Trial | None = None


def test_waiting_for_resources_shows_only_while_waiting():
    from dasktune.dashboard._components import Summary

    events, driver, state = _Events(), _Driver(), DashboardState()
    callback = DashboardCallback(events, {"name": "e", "experiment_id": "e"},
                                 flush_interval=0)
    trial = Trial("t1", {"lr": 1})

    def page() -> tuple[object, str]:
        for msg in events.messages:
            state.apply(msg)
        events.messages.clear()
        summary = Summary()
        summary.update(state.snapshot("e"), 0.0)
        return state.experiments()[0]["waiting"], summary.root.text

    callback.setup(controller=driver)
    callback.on_step_end(iteration=1, trials=[trial])
    waiting, text = page()
    assert waiting is None and "waiting for resources" not in text and "(waiting)" not in text

    # The driver could not place the trial: the page says why, and marks it waiting.
    driver._waiting_reason, driver._waiting_trial = "the cluster has no workers", trial
    callback.on_step_end(iteration=2, trials=[trial])
    waiting, text = page()
    assert waiting == "waiting for resources: the cluster has no workers"
    assert waiting in text and "PENDING</span> 1 (waiting)" in text

    # The waiting trial ended without starting (stopped early): no longer waiting.
    trial.set_status("TERMINATED")
    callback.on_step_end(iteration=3, trials=[trial])
    waiting, text = page()
    assert waiting is None and "waiting for resources" not in text

    # Waiting again, then the experiment ends: a finished experiment waits for nothing.
    trial2 = Trial("t2", {"lr": 2})
    driver._waiting_reason, driver._waiting_trial = "all workers busy", trial2
    callback.on_step_end(iteration=4, trials=[trial, trial2])
    assert page()[0] == "waiting for resources: all workers busy"
    callback.on_experiment_end(trials=[trial, trial2])
    waiting, text = page()
    assert waiting is None and "waiting" not in text


def test_waiting_note_in_messages():
    assert experiment_message("e", {}, status="RUNNING")["waiting"] is None
    msg = experiment_message("e", {}, status="RUNNING", waiting="waiting for resources: x")
    state = DashboardState()
    state.apply(msg)
    assert state.experiments()[0]["waiting"] == "waiting for resources: x"
    state.apply(experiment_message("e", {}, status="FINISHED", waiting="stale"))
    assert state.experiments()[0]["waiting"] is None


def test_curves_are_thinned_at_the_source_but_keep_what_the_page_needs():
    """100k reports send a few thousand points (the scheduler's event log keeps the
    messages), yet every improvement of the best, each trial's last value and a
    trial's first ``points_per_trial`` values all reach the page."""
    events = _Events()
    callback = DashboardCallback(events, {"name": "e", "experiment_id": "e", "metric": "loss",
                                          "mode": "min"}, flush_interval=3600,
                                 points_per_trial=100)
    rng = random.Random(0)
    trials = [Trial(f"t{i}", {}) for i in range(2)]
    best, improvements, last = float("inf"), [], {}
    for i in range(50_000):
        for trial in trials:
            loss = rng.random() + 10.0 / (i + 1)
            result = {"loss": loss, "training_iteration": i + 1, "timestamp": float(i)}
            callback.on_trial_result(iteration=i, trials=trials, trial=trial, result=result)
            if loss < best:
                best = loss
                improvements.append((trial.trial_id, i + 1))
            last[trial.trial_id] = i + 1
    for trial in trials:
        callback.on_trial_complete(iteration=0, trials=trials, trial=trial)
    callback.flush()
    sent = [tuple(p[:2]) for m in events.messages if m["type"] == "results"
            for p in m["points"]]
    assert len(sent) < 2 * (100 + 50 * 10 + len(improvements))  # log2(50000/100) < 10
    assert set(improvements) <= set(sent)
    assert all((tid, it) in sent for tid, it in last.items())
    assert all((t.trial_id, i) in sent for t in trials for i in range(1, 101))
    # The page's best-so-far curve is exact.
    state = DashboardState()
    for msg in events.messages:
        state.apply(msg)
    assert state.snapshot("e").best_so_far[-1][1] == pytest.approx(best)


def test_state_bounds_the_points_of_a_whole_experiment():
    """Many short trials: each curve is under its own cap, yet the experiment's points
    stay bounded (curves thinned together, each keeping its first and newest point)."""
    state = DashboardState(max_points=100, max_experiment_points=1000)
    state.apply({"type": "experiment", "experiment_id": "e", "mode": "min",
                 "status": "RUNNING"})
    for trial in range(100):
        state.apply({"type": "results", "experiment_id": "e",
                     "points": [[f"t{trial}", i, 1.0 / i, float(i)] for i in range(1, 51)]})
    view = state.snapshot("e")
    assert len(view.points) == 100
    assert sum(map(len, view.points.values())) <= 1000
    assert all(c[0][0] == 1 and c[-1][0] == 50 for c in view.points.values())
    lengths = [len(c) for c in view.points.values()]
    assert min(lengths) >= 4, lengths  # the first trials' curves are not thinned away
    # More trials than the cap allows two points each: the store then grows with the
    # trials only (at most four points a trial on average), not with their reports.
    for trial in range(100, 2000):
        state.apply({"type": "results", "experiment_id": "e",
                     "points": [[f"t{trial}", i, 1.0, float(i)] for i in (1, 2, 3)]})
    counts = [len(c) for c in state.snapshot("e").points.values()]
    assert len(counts) == 2000 and max(counts) <= 3 and sum(counts) <= 2 * 2 * 2000


def test_plugin_settings_travel_to_the_scheduler():
    plugin = DasktuneDashboardPlugin(max_points=50, max_experiment_points=500)
    clone = pickle.loads(pickle.dumps(plugin))
    assert (clone.max_points, clone.max_experiment_points) == (50, 500)
    with pytest.raises(ValueError, match="max_experiment_points"):
        DasktuneDashboardPlugin(max_points=50, max_experiment_points=10)


def test_a_trial_holding_a_gang_shows_it_in_its_row_and_on_the_gantt_chart():
    from dasktune.dashboard._components import TrialTable
    from dasktune.dashboard._gantt import PlacementGantt
    from dasktune.dashboard._state import ExperimentView

    trial = Trial("g1", {})
    trial.set_status("RUNNING")
    trial.placements.append(Placement(1, "tcp://10.0.0.1:1", "h1", 10.0, gang=[
        "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"], gang_start=11.0))
    record = trial_record(trial, None, None)
    assert record["gang_workers"] == 2
    assert record["placements"][0]["gang"] == ["tcp://10.0.0.2:1", "tcp://10.0.0.3:1"]
    view = ExperimentView("e", info={"end_time": 20.0}, trials={"g1": record})
    gantt = PlacementGantt()
    gantt.update(view, now=20.0)
    data = gantt.source.data
    bars = sorted(zip(data["worker"], data["outcome"], data["left"], data["line_dash"]))
    assert [(w, o) for w, o, _, _ in bars] == [
        ("10.0.0.1:1", "running"), ("10.0.0.2:1", "gang rank 0"), ("10.0.0.3:1", "gang rank 1")]
    assert [left for _, o, left, _ in bars if o.startswith("gang")] == [11000.0, 11000.0]
    assert [d for _, o, _, d in bars if o.startswith("gang")] == ["dotted", "dotted"]
    table = TrialTable()
    table.update(view, now=20.0)
    assert table.source.data["worker"] == ["10.0.0.1:1 +2 workers"]
