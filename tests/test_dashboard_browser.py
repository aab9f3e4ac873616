"""Headless Chromium opens the dasktune page while an experiment runs on a real cluster.

Needs Debian's ``chromium`` and the ``playwright`` Python package (never
``playwright install``). Without them the test skips and says why; with ``CI=true`` a
missing browser fails instead. The screenshot lands in ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import time

import fsspec
import pytest
from distributed import Client, LocalCluster

from dasktune.dashboard import DashboardCallback, register_dashboard, serve_static
from dasktune.trial import Placement, Trial

pytestmark = pytest.mark.timeout(120)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = pathlib.Path(__file__).resolve().parent.parent / "test-artifacts"
WAIT_MS = 20_000

CURVES_JS = """([n, best]) => {
    const doc = window.Bokeh && Bokeh.documents[0];
    const src = doc && doc.get_model_by_name('dasktune-curves');
    if (!src || src.data.xs.length !== n) return false;
    if (!Array.from(src.data.xs).every(xs => xs.length > 0)) return false;
    const widths = Array.from(src.data.width);
    const thick = widths.filter(w => w > 2).length;
    return best === null || (thick === 1 && src.data.trial_id[widths.indexOf(4)] === best);
}"""


@pytest.fixture(scope="module")
def browser():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        reason = "browser test needs " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " -- required in CI")
        pytest.skip(reason)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(WAIT_MS)
    yield page
    page.close()


def rows(page):
    return page.locator(".slick-row")  # Playwright's CSS pierces Bokeh's shadow roots


def expect_statuses(page, statuses: dict[str, str]) -> None:
    """Wait until the table has one row per trial, each showing its status."""
    from playwright.sync_api import expect

    expect(rows(page)).to_have_count(len(statuses), timeout=WAIT_MS)
    for trial_id, status in statuses.items():
        cell = page.locator(".slick-cell.l0", has_text=re.compile(rf"^{re.escape(trial_id)}$"))
        row = rows(page).filter(has=cell)
        expect(row.locator(".slick-cell.l1")).to_have_text(status, timeout=WAIT_MS)


class Experiment:
    """Plays the controller: moves real Trial objects and calls the callback's hooks."""

    def __init__(self, client: Client, n_trials: int):
        self.workers = sorted(client.scheduler_info()["workers"])
        self.cb = DashboardCallback(client, {
            "name": "browser-exp", "metric": "loss", "mode": "min",
            "searcher": "BasicVariantGenerator", "scheduler": "ASHAScheduler",
            "storage": "s3://user:pass@bucket/results/browser-exp"}, flush_interval=0)
        self.trials = [Trial(f"t{i}", {"lr": round(0.01 * (i + 1), 3), "layers": i + 1})
                       for i in range(n_trials)]
        self.step = 0
        self.cb.setup(total_num_samples=n_trials)
        self.cb.on_step_end(self.step, self.trials)

    def start(self, trial: Trial, worker: str) -> None:
        trial.set_status("RUNNING")
        trial.attempt += 1
        trial.placements.append(Placement(trial.attempt, worker, "127.0.0.1", time.time()))
        self.cb.on_trial_start(self.step, self.trials, trial)

    def end(self, trial: Trial, status: str, outcome: str, reason: str | None = None):
        trial.placements[-1].end, trial.placements[-1].outcome = time.time(), outcome
        trial.stop_reason = reason
        trial.set_status(status)
        if status == "TERMINATED":
            self.cb.on_trial_complete(self.step, self.trials, trial)

    def report(self, trial: Trial, iteration: int) -> None:
        n = int(trial.trial_id[1:])
        result = {"training_iteration": iteration, "loss": (n + 2) / (iteration + 1) + 0.1 * n}
        trial.update_last_result(result)
        self.cb.on_trial_result(self.step, self.trials, trial, result)

    def end_step(self) -> None:
        self.step += 1
        self.cb.on_step_end(self.step, self.trials)


def test_live_page_in_chromium(browser, page):
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        url = register_dashboard(client)
        exp = Experiment(client, n_trials=4)
        t0, t1, t2, t3 = exp.trials
        page.goto(url)
        expect_statuses(page, {t.trial_id: "PENDING" for t in exp.trials})

        w0, w1 = exp.workers
        for trial, worker in zip(exp.trials, [w0, w0, w1, w1], strict=True):
            exp.start(trial, worker)
        for it in (1, 2, 3):
            for trial in exp.trials:
                exp.report(trial, it)
            exp.end_step()
        expect_statuses(page, {t.trial_id: "RUNNING" for t in exp.trials})
        page.wait_for_function(CURVES_JS, arg=[4, None])

        # Worker w1 is lost: its trials restart on w0 from their iteration-2 checkpoints.
        for trial in (t2, t3):
            exp.end(trial, "PENDING", "lost")
            trial.num_restarts += 1
            exp.cb.on_trial_recover(exp.step, exp.trials, trial)
        exp.end_step()
        expect_statuses(page, {t0.trial_id: "RUNNING", t1.trial_id: "RUNNING",
                               t2.trial_id: "PENDING", t3.trial_id: "PENDING"})
        for trial in (t2, t3):
            exp.start(trial, w0)
            exp.cb.on_trial_restore(exp.step, exp.trials, trial)
        # The scheduler prunes t1; the others train on.
        exp.end(t1, "TERMINATED", "stopped", reason="early_stopped")
        for it in range(3, 9):
            for trial in (t0, t2, t3):
                if it > 3 or trial is not t0:
                    exp.report(trial, it)
            exp.end_step()
        for trial in (t0, t2, t3):
            exp.end(trial, "TERMINATED", "done")
        exp.end_step()
        exp.cb.on_experiment_end(exp.trials)

        expect_statuses(page, {t.trial_id: "TERMINATED" for t in exp.trials})
        page.wait_for_function(CURVES_JS, arg=[4, "t0"])
        from playwright.sync_api import expect
        summary = page.locator(".bk-Div").first
        expect(summary).to_contain_text("FINISHED", timeout=WAIT_MS)
        expect(summary).to_contain_text("TERMINATED 4", timeout=WAIT_MS)
        gantt = page.evaluate("""() => {
            const src = Bokeh.documents[0].get_model_by_name('dasktune-placements');
            return Array.from(src.data.outcome).map((o, i) => o + ":" + src.data.trial_id[i]);
        }""")
        assert sorted(gantt) == ["done:t0", "done:t2", "done:t3", "lost:t2", "lost:t3",
                                 "stopped:t1"]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)


def _static_fixture_module():
    # Loaded by path so the fixture writer is shared whatever pytest's import mode.
    path = pathlib.Path(__file__).with_name("test_dashboard_static.py")
    spec = importlib.util.spec_from_file_location("_dashboard_static_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_static_page_in_chromium(page, tmp_path):
    root = str(tmp_path / "fixture-exp")
    _static_fixture_module().write_experiment(fsspec.filesystem("file"), root)
    server, url = serve_static(root)
    with server:
        page.goto(url)
        expect_statuses(page, {f"{i:05d}": "TERMINATED" for i in range(3)})
        page.wait_for_function(CURVES_JS, arg=[3, "00000"])


def _gated(config):
    """Three reports, then wait (bounded) for the test to open the gate, then two more."""
    import dasktune as tune

    for i in range(1, 4):
        tune.report({"loss": config["x"] + 1.0 / i})
    deadline = time.monotonic() + 60
    while not os.path.exists(config["gate"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for i in range(4, 6):
        tune.report({"loss": config["x"] + 1.0 / i})


def test_real_tuner_live_in_chromium(page, local_client, tmp_path):
    """A real ``Tuner.fit()`` on the embedded cluster (worker processes) feeds the page:
    the table shows every trial RUNNING with one curve each while they run, and all
    TERMINATED with the best highlighted after ``fit()`` returns."""
    import threading

    import requests
    from conftest import wait_for

    import dasktune as tune

    gate = str(tmp_path / "gate")
    tuner = tune.Tuner(
        _gated, param_space={"x": tune.grid_search([0.0, 1.0]), "gate": gate},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="browser-live", storage_path=str(tmp_path / "r"),
                                  verbose=0))
    out: dict = {}
    fit = threading.Thread(target=lambda: out.setdefault("results", tuner.fit()), daemon=True)
    fit.start()
    try:
        base = local_client.dashboard_link.split("/status")[0]

        def experiment():
            resp = requests.get(f"{base}/dasktune/api/experiments", timeout=5)
            if resp.status_code != 200:  # fit() registers the page as it starts
                return None
            return next((e for e in resp.json()["experiments"]
                         if e.get("name") == "browser-live"), None)

        eid = wait_for(experiment, timeout=30, what="the experiment on the dashboard")[
            "experiment_id"]

        def trial_ids():
            got = requests.get(f"{base}/dasktune/api/trials", params={"experiment": eid},
                               timeout=5).json()["trials"]
            return [t["trial_id"] for t in got] if len(got) == 2 else None

        ids = wait_for(trial_ids, timeout=30, what="both trials on the dashboard")
        page.goto(f"{base}/dasktune?experiment={eid}")
        expect_statuses(page, {tid: "RUNNING" for tid in ids})
        page.wait_for_function(CURVES_JS, arg=[2, None])
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-live-tuner.png"), full_page=True)
    finally:
        open(gate, "w").close()
        fit.join(90)
    results = out["results"]
    assert results.num_terminated == 2
    best = results.get_best_result().metrics["trial_id"]
    expect_statuses(page, {tid: "TERMINATED" for tid in ids})
    page.wait_for_function(CURVES_JS, arg=[2, best])


# Every drawn Gantt label fits its bar on screen (measured through the rendered plot's
# own scale and the canvas's text metrics), and bars too narrow for their id carry none.
GANTT_LABELS_JS = """() => {
    const doc = Bokeh.documents[0];
    const fig = doc.get_model_by_name('dasktune-gantt');
    const bars = doc.get_model_by_name('dasktune-placements').data;
    const labels = doc.get_model_by_name('dasktune-gantt-labels').data;
    const view = Bokeh.index.find_one(fig);
    const scale = view.frame.x_scale;
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = '11px helvetica';
    const drawn = new Set(Array.from(labels.text).map((t, i) => t + '@' + labels.x[i]));
    const out = {bars: bars.left.length, fit: 0, drawn: drawn.size, misfits: []};
    for (let i = 0; i < bars.left.length; i++) {
        const px = Math.abs(scale.compute(bars.right[i]) - scale.compute(bars.left[i]));
        const fits = ctx.measureText(String(bars.trial_id[i])).width + 8 <= px;
        out.fit += fits;
        if (fits !== drawn.has(bars.trial_id[i] + '@' + bars.left[i]))
            out.misfits.push([bars.trial_id[i], px, fits]);
    }
    out.rows = fig.y_range.factors.length;
    out.row_px = view.frame.bbox.height / out.rows;
    return out;
}"""

STOPPED_MARKS_JS = """() => {
    const d = Bokeh.documents[0].get_model_by_name('dasktune-stopped-marks').data;
    return Array.from(d.trial_id).sort();
}"""


def check_gantt_labels(page) -> dict:
    """Labels drawn exactly where they fit; the y-axis has a text line per row."""
    page.wait_for_function("""() => {
        const d = Bokeh.documents[0].get_model_by_name('dasktune-gantt-labels').data;
        return d.text.length > 0;
    }""")
    got = page.evaluate(GANTT_LABELS_JS)
    assert got["misfits"] == [], got
    assert got["row_px"] >= 14, got  # 11px worker names on the y-axis do not overlap
    return got


def _asha_trainable(config):
    import dasktune as tune

    for i in range(1, 10):
        tune.report({"loss": config["x"] + 1.0 / i})
        time.sleep(0.05)


def test_asha_run_marks_stopped_trials_in_chromium(page, local_client, tmp_path):
    """A real 12-trial ASHA run: the trials ASHA stopped are marked in the JSON, the
    table and on their curves; one line per trial; Gantt labels only where they fit."""
    import requests

    import dasktune as tune

    tuner = tune.Tuner(
        _asha_trainable, param_space={"x": tune.grid_search([i / 10 for i in range(12)])},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min",
            scheduler=tune.schedulers.ASHAScheduler(max_t=9, grace_period=1,
                                                    reduction_factor=3)),
        run_config=tune.RunConfig(name="browser-asha", storage_path=str(tmp_path / "r"),
                                  verbose=0))
    results = tuner.fit()
    ran = {r.metrics["trial_id"]: r.metrics["training_iteration"] for r in results}
    stopped = sorted(t for t, n in ran.items() if n < 9)
    assert stopped, "ASHA stopped no trial: the test shows nothing"
    base = local_client.dashboard_link.split("/status")[0]
    eid = next(e["experiment_id"] for e in requests.get(
        f"{base}/dasktune/api/experiments", timeout=5).json()["experiments"]
        if e["name"] == "browser-asha")
    trials = requests.get(f"{base}/dasktune/api/trials", params={"experiment": eid},
                          timeout=5).json()["trials"]
    assert sorted(t["trial_id"] for t in trials if t["stopped_early"]) == stopped
    for t in trials:
        n = ran[t["trial_id"]]
        want = f"stopped early at rung {n} (of 9 iterations)" if t["stopped_early"] else None
        assert t["status_detail"] == want

    page.goto(f"{base}/dasktune?experiment={eid}")
    expect_statuses(page, {tid: "TERMINATED" for tid in ran})
    best = results.get_best_result().metrics["trial_id"]
    page.wait_for_function(CURVES_JS, arg=[12, best])
    assert page.evaluate(STOPPED_MARKS_JS) == stopped
    from playwright.sync_api import expect
    detail = page.locator(".slick-cell.l2", has_text="stopped early at rung")
    expect(detail).to_have_count(len(stopped))
    check_gantt_labels(page)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-12-trials.png"), full_page=True)


def test_hundred_trials_stay_readable_in_chromium(page, local_client):
    """100 short trials (simulated, on the real cluster's dashboard): 100 lines, the best
    one the only thick one, every stopped one marked, and short bars left unlabelled."""
    url = register_dashboard(local_client)
    workers = sorted(local_client.scheduler_info()["workers"])
    t0 = time.time() - 70  # the 100 trials fill four slots for about a minute
    cb = DashboardCallback(local_client, {
        "name": "browser-100", "metric": "loss", "mode": "min", "start_time": t0,
        "searcher": "BasicVariantGenerator", "scheduler": "ASHAScheduler"},
        flush_interval=0)
    trials = [Trial(f"t{i:03d}", {"lr": round(0.001 * (i + 1), 4), "layers": 1 + i % 4})
              for i in range(100)]
    cb.setup(total_num_samples=len(trials))
    # ASHA-like budgets: most trials stop at 1 or 3 iterations, a few run all 9; four
    # slots (two per worker) take trials in order, an iteration a second.
    slots = [0.0] * 4
    stopped = []
    for i, trial in enumerate(trials):
        n = 9 if i % 10 == 0 else 3 if i % 3 == 0 else 1
        slot = min(range(4), key=slots.__getitem__)
        start = t0 + slots[slot]
        slots[slot] += n
        trial.set_status("RUNNING")
        trial.attempt += 1
        trial.placements.append(Placement(1, workers[slot % 2], "127.0.0.1", start))
        cb.on_trial_start(i, trials, trial)
        for it in range(1, n + 1):
            result = {"training_iteration": it, "timestamp": start + it,
                      "loss": 1.0 / it + (i % 17) / 20}
            trial.update_last_result(result)
            cb.on_trial_result(i, trials, trial, result)
        trial.placements[-1].end = start + n
        trial.placements[-1].outcome = "done" if n == 9 else "stopped"
        if n < 9:
            trial.stop_reason = "early_stopped"
            stopped.append(trial.trial_id)
        trial.set_status("TERMINATED")
        cb.on_trial_complete(i, trials, trial)
    cb.on_experiment_end(trials)

    page.goto(f"{url}?experiment={cb.experiment_id}")
    page.wait_for_function(CURVES_JS, arg=[100, "t000"])
    assert page.evaluate(STOPPED_MARKS_JS) == stopped
    got = check_gantt_labels(page)
    assert 0 < got["drawn"] < got["bars"] == 100, got  # some bars are too short to label
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-100-trials.png"), full_page=True)
