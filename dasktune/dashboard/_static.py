"""``dasktune dashboard PATH_OR_URI``: the same page for a finished experiment, no cluster.

:func:`load_experiment` rebuilds the dashboard messages from storage
(``experiment_state.json`` and each trial's ``result.json``, read through fsspec) and
:func:`serve_static` serves the page and JSON endpoints from a Bokeh server on a
background thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import posixpath
import threading
from typing import Any

import fsspec

from dasktune.dashboard._messages import (
    FINISHED,
    RESULTS,
    TRIALS,
    check_metric_mode,
    experiment_message,
    result_point,
    trial_record,
)
from dasktune.dashboard._redact import finite_number
from dasktune.dashboard._state import DashboardState
from dasktune.trial import Trial

STATE_FILE = "experiment_state.json"
RESULT_FILE = "result.json"


def load_experiment(path_or_uri: str, state: DashboardState | None = None,
                    **storage_options: Any) -> DashboardState:
    """Read a finished (or interrupted) experiment folder into a :class:`DashboardState`."""
    if not isinstance(path_or_uri, str) or not path_or_uri:
        raise TypeError(f"experiment path must be a non-empty str, got {path_or_uri!r}")
    uri = path_or_uri if "://" in path_or_uri else os.path.abspath(
        os.path.expanduser(path_or_uri))
    fs, root = fsspec.core.url_to_fs(uri, **storage_options)
    root = root.rstrip("/")
    state_path = posixpath.join(root, STATE_FILE)
    try:
        saved = json.loads(fs.cat_file(state_path))
    except FileNotFoundError:
        raise ValueError(f"{path_or_uri!r} is not a dasktune experiment folder: "
                         f"no {STATE_FILE} in it") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{STATE_FILE} in {path_or_uri!r} is not valid JSON: {exc}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("trials"), list):
        raise ValueError(f"{STATE_FILE} in {path_or_uri!r} has no 'trials' list")
    metric, mode = saved.get("metric"), saved.get("mode")
    check_metric_mode(metric, mode)
    trials = [Trial.from_state(s) for s in saved["trials"]]

    state = state if state is not None else DashboardState()
    name = str(saved.get("name") or posixpath.basename(root))
    # Two experiments of one name (two results folders) stay apart in the selector.
    experiment_id = name if name not in state.experiment_ids() else f"{name} @ {uri}"
    end_times = [t.end_time for t in trials if t.end_time is not None]
    info = {**saved, "name": name, "storage": saved.get("storage") or path_or_uri}
    status = saved.get("status") or (
        FINISHED if all(t.is_finished for t in trials) else "INTERRUPTED")
    state.apply(experiment_message(experiment_id, info, status=status,
                                   end_time=saved.get("end_time") or max(end_times, default=None)))
    state.apply({"type": TRIALS, "experiment_id": experiment_id,
                 "trials": [trial_record(t, metric, mode) for t in trials]})
    state.apply({"type": RESULTS, "experiment_id": experiment_id,
                 "points": _read_points(fs, root, trials, metric)})
    return state


def _read_points(fs: fsspec.AbstractFileSystem, root: str, trials: list[Trial],
                 metric: str | None) -> list[list[Any]]:
    if metric is None or not trials:
        return []
    paths = {posixpath.join(root, t.dirname, RESULT_FILE): t for t in trials}
    blobs = fs.cat(list(paths), on_error="omit")  # one concurrent batch on object stores
    points = []
    for path, trial in paths.items():
        blob = blobs.get(path) or blobs.get(fs._strip_protocol(path))
        if not blob:
            continue
        for line in blob.decode("utf-8", "replace").splitlines():
            try:
                result = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed writer
                continue
            if not isinstance(result, dict):
                continue
            point = result_point(trial.trial_id, result, metric, _result_time(trial, result))
            if point is not None:
                points.append(point)
    points.sort(key=lambda p: p[3])  # best-so-far is built in time order
    return points


def _result_time(trial: Trial, result: dict[str, Any]) -> float:
    stamp = finite_number(result.get("timestamp"))
    if stamp is not None:
        return stamp
    total = finite_number(result.get("time_total_s"))
    return (trial.start_time or 0.0) + (total or 0.0)


class StaticDashboard:
    """A Bokeh server on its own thread serving the page for stored experiments."""

    def __init__(self, state: DashboardState, *, port: int = 0, address: str = "127.0.0.1"):
        self.state = state
        self.address = address
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(port,), daemon=True,
                                        name="dasktune-dashboard")
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        """The page's address."""
        host = "127.0.0.1" if self.address in ("", "0.0.0.0") else self.address
        return f"http://{host}:{self.port}/dasktune"

    def _run(self, port: int) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self._server = self._build(port)
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _build(self, port: int) -> Any:
        import distributed.http.statics
        from bokeh.application import Application
        from bokeh.application.handlers.function import FunctionHandler
        from bokeh.server.server import BaseServer
        from bokeh.server.tornado import BokehTornado
        from bokeh.server.util import bind_sockets
        from tornado import web
        from tornado.httpserver import HTTPServer
        from tornado.ioloop import IOLoop

        from dasktune.dashboard._api import api_routes
        from dasktune.dashboard._page import dasktune_doc

        sockets, self.port = bind_sockets(self.address, port)
        if self.address in ("", "0.0.0.0"):
            origins = ["*"]
        else:
            origins = [f"{h}:{self.port}" for h in {self.address, "localhost", "127.0.0.1"}]
        extra = {"prefix": "/", "pages": ["dasktune"], "plots": [], "jupyter": False}
        doc = functools.partial(dasktune_doc, self.state, None, extra)
        routes = [*api_routes(self.state, "/"), *distributed.http.statics.routes,
                  (r"/", web.RedirectHandler, {"url": "/dasktune"})]
        app = BokehTornado({"/dasktune": Application(FunctionHandler(doc))},
                           extra_websocket_origins=origins, extra_patterns=routes,
                           use_index=False, redirect_root=False)
        http_server = HTTPServer(app)
        http_server.add_sockets(sockets)
        server = BaseServer(IOLoop.current(), app, http_server)
        server.start()
        return server

    def stop(self) -> None:
        """Stop serving and end the thread (idempotent)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not self._thread.is_alive():
            return

        def shutdown() -> None:
            self._server.stop(wait=False)
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        self._thread.join(timeout=10)

    def join(self, timeout: float | None = None) -> None:
        """Block until :meth:`stop` (the CLI waits here until Ctrl-C)."""
        self._thread.join(timeout)

    def __enter__(self) -> StaticDashboard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_static(experiment_path_or_uri: str | list[str], port: int = 0, *,
                 address: str = "127.0.0.1",
                 **storage_options: Any) -> tuple[StaticDashboard, str]:
    """Serve the dasktune page and JSON for finished experiments read from storage.

    Returns the running server (call ``stop()``, or ``join()`` to block) and the page URL.
    Several paths may be given; each becomes one entry of the experiment selector.
    """
    paths = ([experiment_path_or_uri] if isinstance(experiment_path_or_uri, str)
             else list(experiment_path_or_uri))
    if not paths:
        raise ValueError("serve_static needs at least one experiment path")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in 0..65535, got {port!r}")
    state = DashboardState()
    for path in paths:
        load_experiment(path, state, **storage_options)
    server = StaticDashboard(state, port=port, address=address)
    return server, server.url
