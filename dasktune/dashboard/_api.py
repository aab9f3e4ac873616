"""JSON endpoints beside the page, for scripts: ``api/experiments`` and ``api/trials``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tornado import web

if TYPE_CHECKING:
    from dasktune.dashboard._state import DashboardState


class _JSONHandler(web.RequestHandler):
    def initialize(self, state: DashboardState) -> None:
        self.state = state

    def send(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(obj, allow_nan=False, default=str))

    def error(self, status: int, message: str) -> None:
        self.send({"error": message}, status)


class ExperimentsHandler(_JSONHandler):
    """``GET api/experiments`` -> ``{"experiments": [summary, ...]}``, newest first."""

    def get(self) -> None:
        self.send({"experiments": self.state.experiments()})


class TrialsHandler(_JSONHandler):
    """``GET api/trials?experiment=<id>[&points=1]`` -> that experiment's trial records.

    ``experiment`` may be left out when the dashboard knows a single experiment;
    ``points=1`` adds each trial's ``[training_iteration, value, t]`` curve.
    """

    def get(self) -> None:
        experiment_id = self.get_argument("experiment", None)
        ids = self.state.experiment_ids()
        if experiment_id is None:
            if len(ids) != 1:
                self.error(400, f"give ?experiment=<id>; known experiments: {ids}")
                return
            experiment_id = ids[0]
        points = self.get_argument("points", "0").lower() in ("1", "true", "yes")
        try:
            trials = self.state.trials(experiment_id, points=points)
        except KeyError:
            self.error(404, f"unknown experiment {experiment_id!r}; known: {ids}")
            return
        self.send({"experiment_id": experiment_id, "trials": trials})


def api_routes(state: DashboardState, prefix: str = "/") -> list[tuple[str, type, dict]]:
    """Tornado routes for the endpoints under ``<prefix>dasktune/api/``."""
    base = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    args = {"state": state}
    return [
        (rf"{base}dasktune/api/experiments/?", ExperimentsHandler, args),
        (rf"{base}dasktune/api/trials/?", TrialsHandler, args),
    ]
