"""The ``/dasktune`` Bokeh document: a selector and the parts, on one periodic callback."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bokeh.layouts import column, row
from distributed.dashboard.components import DashboardComponent, add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env

from dasktune.dashboard._components import (
    BestSoFar,
    ExperimentSelector,
    MetricCurves,
    Summary,
    TrialTable,
)
from dasktune.dashboard._gantt import PlacementGantt

if TYPE_CHECKING:
    from bokeh.document import Document

    from dasktune.dashboard._state import DashboardState

# Page refresh period; the driver flushes every 0.5 s, so the page is < 1.5 s behind.
UPDATE_INTERVAL_MS = 500
# Running experiments re-render at least this often even without news (elapsed, bars).
_CLOCK_REFRESH_S = 1.0


class DasktunePage(DashboardComponent):
    """The whole page for one browser tab; ``update()`` re-renders when data changed."""

    def __init__(self, state: DashboardState, experiment_id: str | None = None):
        super().__init__()
        self.state = state
        self.experiment_id = experiment_id
        self._shown: tuple[str | None, int] = (None, -2)
        self._rendered_at = 0.0
        self._running = False
        self.selector = ExperimentSelector(state, self.select)
        self.summary = Summary(sizing_mode="stretch_width")
        self.table = TrialTable(sizing_mode="stretch_width")
        self.curves = MetricCurves(sizing_mode="stretch_width")
        self.best = BestSoFar(sizing_mode="stretch_width")
        self.gantt = PlacementGantt(sizing_mode="stretch_width")
        self.parts = [self.summary, self.table, self.curves, self.best, self.gantt]
        self.root = column(
            row(self.selector.root, self.summary.root, sizing_mode="stretch_width"),
            self.table.root,
            row(self.curves.root, self.best.root, sizing_mode="stretch_width"),
            self.gantt.root,
            sizing_mode="stretch_width",
            name="dasktune-page",
        )

    def select(self, experiment_id: str) -> None:
        """Show another experiment (the selector's callback)."""
        if experiment_id != self.experiment_id:
            self.experiment_id = experiment_id
            self.update()

    def update(self) -> None:
        ids = self.state.experiment_ids()
        if self.experiment_id not in ids and ids:
            self.experiment_id = ids[0]
        self.selector.update(self.experiment_id)
        key = (self.experiment_id, self.state.version(self.experiment_id))
        now = time.time()
        if key == self._shown and not self._clock_due(now):
            return
        view = self.state.snapshot(self.experiment_id) if self.experiment_id else None
        for part in self.parts:
            part.update(view, now)
        self._shown, self._rendered_at = key, now
        self._running = view is not None and view.info.get("end_time") is None

    def _clock_due(self, now: float) -> bool:
        return self._running and now - self._rendered_at >= _CLOCK_REFRESH_S


def dasktune_doc(state: DashboardState, server: Any, extra: dict[str, Any],
                 doc: Document) -> None:
    """Build the page into ``doc`` (the signature Dask's ``BokehApplication`` calls)."""
    requested = None
    context = getattr(doc, "session_context", None)
    request = getattr(context, "request", None)
    if request is not None:
        values = request.arguments.get("experiment") or []
        if values:
            requested = values[0].decode() if isinstance(values[0], bytes) else str(values[0])
    page = DasktunePage(state, requested)
    page.update()
    add_periodic_callback(doc, page, UPDATE_INTERVAL_MS)
    doc.title = "Dask: dasktune"
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME

