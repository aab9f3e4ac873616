"""The dasktune page's parts, in Dask's dashboard-component style.

Each component owns a Bokeh data source and a ``root`` model, and rebuilds its data in
``update(view, now)`` from an :class:`~dasktune.dashboard._state.ExperimentView`
snapshot (the page calls them from one periodic callback, so they all show the same
moment). Nothing here reads the scheduler or storage.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DataTable,
    DatetimeTickFormatter,
    Div,
    HoverTool,
    NumberFormatter,
    Select,
    StringFormatter,
    TableColumn,
)
from bokeh.palettes import Category10
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent

if TYPE_CHECKING:
    from dasktune.dashboard._state import DashboardState, ExperimentView

PALETTE = Category10[10]
GREY = "#9e9e9e"
STATUS_COLORS = {
    "PENDING": "#7f7f7f",
    "RUNNING": "#1f77b4",
    "PAUSED": "#ff7f0e",
    "TERMINATED": "#2ca02c",
    "ERROR": "#d62728",
}
NAN = float("nan")


def trial_colors(view: ExperimentView) -> dict[str, str]:
    """A stable colour per trial: its position in the experiment's trial order."""
    return {tid: PALETTE[i % len(PALETTE)] for i, tid in enumerate(view.trials)}


def worker_cell(record: dict[str, Any]) -> str:
    """A trial row's worker, and the size of the gang it holds: ``host:port +2 workers``."""
    cell = short_worker(record.get("worker"))
    n = record.get("gang_workers") or 0
    return f"{cell} +{n} worker{'s' if n != 1 else ''}" if n else cell


def short_worker(address: Any) -> str:
    text = "" if address is None else str(address)
    return text.split("://", 1)[-1]


def format_config(config: Any) -> str:
    if not isinstance(config, dict):
        return "" if config is None else str(config)
    return ", ".join(f"{k}={_short(v)}" for k, v in config.items())


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def num(value: Any) -> float:
    """A number for a Bokeh column: None becomes NaN (shown as "–")."""
    return NAN if value is None else float(value)


def ms(t: float | None) -> float:
    """Seconds since the epoch as Bokeh's datetime milliseconds (None: NaN)."""
    return NAN if t is None else t * 1000.0


def time_axis(fig: Any) -> None:
    """Wall-clock ticks without Bokeh's default context lines (``0ms`` over the date)."""
    fig.xaxis.formatter = DatetimeTickFormatter(
        milliseconds="%H:%M:%S.%3N", seconds="%H:%M:%S", minsec="%H:%M:%S",
        minutes="%H:%M", hourmin="%H:%M", hours="%H:%M", days="%b %d", context=None)


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


class ExperimentSelector(DashboardComponent):
    """Chooses which experiment this browser tab shows (several can share a cluster)."""

    def __init__(self, state: DashboardState, on_select: Callable[[str], None]):
        super().__init__()
        self.state = state
        self.on_select = on_select
        self.root = Select(title="Experiment", options=[], width=320,
                           name="dasktune-experiment-select")
        self.root.on_change("value", lambda attr, old, new: new and self.on_select(new))

    def update(self, selected: str | None) -> None:
        options = [(s["experiment_id"], f"{s['name']} [{s['status'] or '?'}]")
                   for s in self.state.experiments()]
        if options != [tuple(o) for o in self.root.options]:
            self.root.options = options
        if selected and self.root.value != selected:
            self.root.value = selected


class Summary(DashboardComponent):
    """Name, storage, searcher, scheduler, metric, trials by status, elapsed, and why
    the experiment waits while it does (its PENDING trials are then marked waiting)."""

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.root = Div(text="<i>waiting for an experiment…</i>", name="dasktune-summary",
                        styles={"font-size": "13px"}, **kwargs)

    def update(self, view: ExperimentView | None, now: float) -> None:
        if view is None:
            return
        s = view.summary()
        e = html.escape
        waiting = s.get("waiting")
        by_status = " · ".join(
            f'<span style="color:{STATUS_COLORS.get(k, "#333")}">{e(str(k))}</span> {n}'
            + (" (waiting)" if waiting and k == "PENDING" else "")
            for k, n in s["trials_by_status"].items()
        )
        best = "–"
        if s["best_trial_id"] is not None:
            best = f"{s['best_value']:.6g} (trial {e(s['best_trial_id'])})"
        metric = f"{e(str(s['metric']))} ({e(str(s['mode']))})" if s["metric"] else "–"
        rows = [
            ("Experiment", f"<b>{e(s['name'] or s['experiment_id'])}</b> "
                           f"— {e(str(s['status'] or '?'))}"),
            ("Storage", e(str(s["storage"] or "–"))),
            ("Searcher", e(str(s["searcher"] or "–"))),
            ("Scheduler", e(str(s["scheduler"] or "–"))),
            ("Metric", metric),
            ("Best", best),
            ("Trials", f"{s['num_trials']} — {by_status or 'none yet'}"),
            ("Elapsed", format_duration(s["elapsed_s"])),
        ]
        if waiting:
            rows.insert(1, ("Waiting", f'<span style="color:#b35900">{e(str(waiting))}</span>'))
        text = "<table>" + "".join(
            f'<tr><td style="padding-right:12px;color:#666">{k}</td><td>{v}</td></tr>'
            for k, v in rows
        ) + "</table>"
        if text != self.root.text:
            self.root.text = text


class TrialTable(DashboardComponent):
    """One sortable row per trial: id, status (and why it stopped early), config,
    iteration, metric, where, restarts."""

    COLUMNS = ("trial_id", "status", "status_color", "detail", "config", "iteration", "last",
               "best", "worker", "host", "restarts")

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.source = ColumnDataSource({c: [] for c in self.COLUMNS},
                                       name="dasktune-trials")
        number = NumberFormatter(format="0.[000000]", nan_format="–", null_format="–")
        integer = NumberFormatter(format="0", nan_format="–", null_format="–")
        self.last_col = TableColumn(field="last", title="last", formatter=number, width=90)
        self.best_col = TableColumn(field="best", title="best", formatter=number, width=90)
        columns = [
            TableColumn(field="trial_id", title="trial", width=90),
            TableColumn(field="status", title="status", width=90,
                        formatter=StringFormatter(text_color="status_color",
                                                  font_style="bold")),
            TableColumn(field="detail", title="detail", width=170),
            TableColumn(field="config", title="config", width=300),
            TableColumn(field="iteration", title="iter", formatter=integer, width=50),
            self.last_col,
            self.best_col,
            TableColumn(field="worker", title="worker", width=140),
            TableColumn(field="host", title="host", width=100),
            TableColumn(field="restarts", title="restarts", formatter=integer, width=60),
        ]
        self.root = DataTable(source=self.source, columns=columns, sortable=True,
                              index_position=None, height=120, name="dasktune-trial-table",
                              **kwargs)
        # Bokeh 3.9's table redraws only when its CDSView's indices change, i.e. not when
        # new data keeps the row count; nudge the view so that live statuses show (and
        # the user's sort order survives, unlike a full re-render).
        self.source.js_on_change("data", CustomJS(args={"view": self.root.view},
                                                  code="view.change.emit()"))

    def update(self, view: ExperimentView | None, now: float) -> None:
        if view is None:
            return
        records = list(view.trials.values())
        early = view.early_stops()
        metric = view.info.get("metric") or "metric"
        self.last_col.title = f"last {metric}"
        self.best_col.title = f"best {metric}"
        self.source.data = {
            "trial_id": [r["trial_id"] for r in records],
            "status": [r.get("status") for r in records],
            "status_color": [STATUS_COLORS.get(r.get("status"), "#333") for r in records],
            "detail": [early.get(r["trial_id"], "") for r in records],
            "config": [format_config(r.get("config")) for r in records],
            "iteration": [num(r.get("iteration")) for r in records],
            "last": [num(r.get("last")) for r in records],
            "best": [num(r.get("best")) for r in records],
            "worker": [worker_cell(r) for r in records],
            "host": [r.get("host") or "" for r in records],
            "restarts": [num(r.get("restarts")) for r in records],
        }
        # Tall enough to show every row up to a point (the grid only draws visible rows).
        height = min(60 + 26 * max(len(records), 1), 640)
        if self.root.height != height:
            self.root.height = height


class MetricCurves(DashboardComponent):
    """The metric of every trial against ``training_iteration``: one line per trial
    (hover: its id and config), the best one thick and drawn last, a cross where a trial
    was stopped early. Lines thin out as trials grow, so 100 trials stay readable."""

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.source = ColumnDataSource(
            {"xs": [], "ys": [], "trial_id": [], "status": [], "config": [], "color": [],
             "alpha": [], "width": [], "dash": []},
            name="dasktune-curves",
        )
        self.best_source = ColumnDataSource({"x": [], "y": [], "trial_id": []},
                                            name="dasktune-best-point")
        self.stop_source = ColumnDataSource({"x": [], "y": [], "trial_id": [], "detail": []},
                                            name="dasktune-stopped-marks")
        self.root = figure(title="Metric per trial", x_axis_label="training_iteration",
                           height=320, tools="pan,wheel_zoom,box_zoom,reset",
                           name="dasktune-curves-figure", **kwargs)
        self.root.xaxis.ticker.min_interval = 1  # iterations are whole numbers
        lines = self.root.multi_line(xs="xs", ys="ys", source=self.source, line_color="color",
                                     line_alpha="alpha", line_width="width", line_dash="dash",
                                     hover_line_alpha=1.0, hover_line_width=3)
        marks = self.root.scatter(x="x", y="y", source=self.stop_source, size=9, marker="x",
                                  line_width=2, color="#d62728",
                                  legend_label="stopped early")
        self.root.scatter(x="x", y="y", source=self.best_source, size=13, marker="star",
                          color="#000000", legend_label="best")
        self.root.legend.location = "top_right"
        self.root.legend.background_fill_alpha = 0.6
        self.root.add_tools(HoverTool(renderers=[lines], tooltips=[
            ("trial", "@trial_id"), ("config", "@config"), ("status", "@status"),
            ("iteration", "$data_x{0}"), ("value", "$data_y{0.[0000]}")]))
        self.root.add_tools(HoverTool(renderers=[marks], tooltips=[
            ("trial", "@trial_id"), ("", "@detail")]))

    def update(self, view: ExperimentView | None, now: float) -> None:
        if view is None:
            return
        colors = trial_colors(view)
        best_id = view.best_trial_id()
        # Past a dozen trials each line gets thinner and fainter, so the bundle shows its
        # shape and the best line (drawn last, thick, opaque) stands out above it.
        crowd = max(1.0, len(view.trials) / 12)
        base_alpha, base_width = max(0.25, 0.85 / math.sqrt(crowd)), max(1.0, 1.5 / crowd)
        data: dict[str, list[Any]] = {k: [] for k in self.source.data}
        marks: dict[str, list[Any]] = {k: [] for k in self.stop_source.data}
        early_stops = view.early_stops()
        order = sorted(view.trials, key=lambda tid: tid == best_id)  # the best one last
        for tid in order:
            record = view.trials[tid]
            points = view.points.get(tid, [])
            status = record.get("status")
            color, alpha, width, dash = colors[tid], base_alpha, base_width, "solid"
            early = tid in early_stops
            if early:
                color, alpha = GREY, min(alpha, 0.6)
                if points:
                    marks["x"].append(points[-1][0])
                    marks["y"].append(points[-1][1])
                    marks["trial_id"].append(tid)
                    marks["detail"].append(early_stops[tid])
            elif status == "ERROR":
                alpha, dash = min(alpha, 0.6), "dotted"
            elif status in ("PENDING", "PAUSED"):
                alpha, dash = min(alpha, 0.6), "dashed"
            if tid == best_id:
                alpha, width = 1.0, 4.0
            data["xs"].append([p[0] for p in points])
            data["ys"].append([p[1] for p in points])
            data["trial_id"].append(tid)
            data["status"].append(str(status) + (" (stopped early)" if early else ""))
            data["config"].append(format_config(record.get("config")))
            data["color"].append(color)
            data["alpha"].append(alpha)
            data["width"].append(width)
            data["dash"].append(dash)
        self.source.data = data
        self.stop_source.data = marks
        best: dict[str, list[Any]] = {"x": [], "y": [], "trial_id": []}
        if best_id is not None:
            target = view.trials[best_id]["best"]
            for iteration, value, _ in view.points.get(best_id, []):
                if value == target:
                    best = {"x": [iteration], "y": [value], "trial_id": [best_id]}
                    break
        self.best_source.data = best
        metric = view.info.get("metric") or "metric"
        title = f"{metric} per trial"
        if best_id is not None:
            title += f" (best: {best_id}, thick line and star)"
        self.root.title.text = title
        self.root.yaxis.axis_label = metric


class BestSoFar(DashboardComponent):
    """The best metric value seen so far, against wall-clock time."""

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.source = ColumnDataSource({"t": [], "best": [], "trial_id": []},
                                       name="dasktune-best-so-far")
        self.root = figure(title="Best so far", x_axis_type="datetime", height=320,
                           tools="pan,wheel_zoom,box_zoom,reset",
                           name="dasktune-best-figure", **kwargs)
        time_axis(self.root)
        self.root.step(x="t", y="best", source=self.source, mode="after", line_width=2)
        dots = self.root.scatter(x="t", y="best", source=self.source, size=6)
        self.root.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("trial", "@trial_id"), ("best", "@best{0.[000000]}"), ("at", "@t{%F %T}")],
            formatters={"@t": "datetime"}))

    def update(self, view: ExperimentView | None, now: float) -> None:
        if view is None:
            return
        series = list(view.best_so_far)
        if series:
            end = view.info.get("end_time") or now
            series.append([max(end, series[-1][0]), series[-1][1], series[-1][2]])
        self.source.data = {
            "t": [ms(p[0]) for p in series],
            "best": [p[1] for p in series],
            "trial_id": [p[2] for p in series],
        }
        self.root.yaxis.axis_label = f"best {view.info.get('metric') or 'metric'}"
