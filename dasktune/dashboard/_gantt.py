"""The placement chart: which worker ran which trial when, one bar per attempt.

Kept apart from :mod:`dasktune.dashboard._components` because of its browser-side part:
a bar carries its trial id only where the text fits inside it at the current zoom (the
browser measures both, on every zoom, pan, resize and update); hover shows the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bokeh.models import ColumnDataSource, CustomJS, FactorRange, HoverTool
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent

from dasktune.dashboard._components import ms, short_worker, time_axis, trial_colors

if TYPE_CHECKING:
    from dasktune.dashboard._state import ExperimentView

OUTCOME_LINE = {"lost": "#d62728", "error": "#d62728"}
LABEL_FONT = "11px helvetica"
ROW_PX = 26  # per worker lane: room for one line of axis text, so labels never overlap

# Keep the labels whose text (plus padding) fits in their bar's width on screen.
_FIT_LABELS_JS = """
const xr = fig.x_range;
const span = xr.end - xr.start;
const width = fig.inner_width;
const d = bars.data;
const out = {x: [], y: [], text: []};
if (span > 0 && width > 0) {
    const scale = width / span;
    const ctx = (window._dasktuneMeasure ||= document.createElement("canvas").getContext("2d"));
    ctx.font = font;
    for (let i = 0; i < d.left.length; i++) {
        const text = String(d.trial_id[i]);
        if (ctx.measureText(text).width + 2 * pad <= (d.right[i] - d.left[i]) * scale) {
            out.x.push(d.left[i]); out.y.push(d.row[i]); out.text.push(text);
        }
    }
}
labels.data = out;
"""


def lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy lane per interval so that overlapping attempts on one worker don't hide."""
    ends: list[float] = []
    out = []
    for start, end in intervals:
        for i, lane_end in enumerate(ends):
            if lane_end <= start:
                ends[i] = end
                out.append(i)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out


def row_name(worker: str, lane: int) -> str:
    """A y-axis row: the worker's address on its first lane, ``·N`` marks its others."""
    return worker if lane == 0 else f"{worker} ·{lane + 1}"


class PlacementGantt(DashboardComponent):
    """Which worker ran which trial when; an attempt cut short by a lost worker is red.

    A trial holding a gang of workers shows a dotted bar on each gang worker too
    (outcome ``gang rank N``), from the grant to the attempt's end.

    Rows are a worker's lanes: a worker running several trials at once gets one lane per
    concurrent attempt, so a trial that moved after a lost worker shows on both.
    """

    COLUMNS = ("row", "worker", "left", "right", "trial_id", "attempt", "outcome", "host",
               "color", "line_color", "line_dash", "hatch")
    EMPTY = ["(no placements yet)"]

    def __init__(self, **kwargs: Any):
        super().__init__()
        self.source = ColumnDataSource({c: [] for c in self.COLUMNS},
                                       name="dasktune-placements")
        self.labels = ColumnDataSource({"x": [], "y": [], "text": []},
                                       name="dasktune-gantt-labels")
        self.root = figure(title="Trial placement per worker", x_axis_type="datetime",
                           y_range=FactorRange(factors=self.EMPTY),
                           height=160, tools="xpan,xwheel_zoom,reset",
                           name="dasktune-gantt", **kwargs)
        time_axis(self.root)
        self.root.yaxis.major_label_text_font_size = "11px"
        bars = self.root.hbar(y="row", left="left", right="right", height=0.8,
                              source=self.source, fill_color="color", fill_alpha=0.7,
                              line_color="line_color", line_width=2, line_dash="line_dash",
                              hatch_pattern="hatch",
                              hatch_color="#d62728", hatch_alpha=0.6)
        self.root.x_range.renderers = [bars]  # the labels never widen the time range
        self.root.text(x="x", y="y", text="text", source=self.labels,
                       text_font_size=LABEL_FONT.split()[0], text_baseline="middle",
                       x_offset=4, name="dasktune-gantt-label-glyphs")
        fit = CustomJS(args={"fig": self.root, "bars": self.source, "labels": self.labels,
                             "font": LABEL_FONT, "pad": 4}, code=_FIT_LABELS_JS)
        self.root.x_range.js_on_change("start", fit)
        self.root.x_range.js_on_change("end", fit)
        self.root.js_on_change("inner_width", fit)
        self.source.js_on_change("data", fit)
        self.root.add_tools(HoverTool(renderers=[bars], tooltips=[
            ("trial", "@trial_id"), ("attempt", "@attempt"), ("worker", "@worker"),
            ("host", "@host"), ("outcome", "@outcome"), ("start", "@left{%T}"),
            ("end", "@right{%T}")], formatters={"@left": "datetime", "@right": "datetime"}))

    def update(self, view: ExperimentView | None, now: float) -> None:
        if view is None:
            return
        colors = trial_colors(view)
        end_of_run = view.info.get("end_time") or now
        bars = []
        for tid, record in view.trials.items():
            for p in record.get("placements") or []:
                if p.get("start") is None:
                    continue
                end = p["end"] if p.get("end") is not None else end_of_run
                outcome = p.get("outcome") or ("running" if p.get("end") is None else "?")
                bars.append((short_worker(p.get("worker")), p["start"], end, tid, p, outcome))
                # The trial's gang: one bar per rank on its worker, from the grant on.
                since = p.get("gang_start") or p["start"]
                for rank, worker in enumerate(p.get("gang") or []):
                    bars.append((short_worker(worker), since, end, tid, p, f"gang rank {rank}"))
        bars.sort(key=lambda b: (b[0], b[1]))
        data: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}
        factors: list[str] = []
        for worker in sorted({b[0] for b in bars}):
            mine = [b for b in bars if b[0] == worker]
            assigned = lanes([(b[1], b[2]) for b in mine])
            factors += [row_name(worker, i) for i in range(max(assigned) + 1)]
            for (_, start, end, tid, p, outcome), lane in zip(mine, assigned, strict=True):
                data["row"].append(row_name(worker, lane))
                data["worker"].append(worker)
                data["left"].append(ms(start))
                data["right"].append(ms(end))
                data["trial_id"].append(tid)
                data["attempt"].append(p.get("attempt"))
                data["outcome"].append(outcome)
                data["host"].append(p.get("host") or "")
                data["color"].append(colors[tid])
                data["line_color"].append(OUTCOME_LINE.get(outcome, colors[tid]))
                data["line_dash"].append("dashed" if outcome in ("stopped", "paused") else
                                         "dotted" if outcome.startswith("gang") else "solid")
                data["hatch"].append("/" if outcome == "lost" else " ")
        factors = factors or self.EMPTY
        if list(self.root.y_range.factors) != factors:
            self.root.y_range.factors = factors
        self.root.height = max(160, 70 + ROW_PX * len(factors))
        self.source.data = data
