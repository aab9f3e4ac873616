"""The scheduler side: a plugin that mounts ``/dasktune`` into Dask's own dashboard.

On ``start`` it builds a Bokeh application for ``/dasktune`` (Dask's
``BokehApplication``, so the page gets Dask's template, theme and prefix), adds it and
the JSON endpoints to ``scheduler.http_application``, and adds "Dasktune" to the
navigation bar of Dask's pages. It then keeps a :class:`DashboardState` fed by
:class:`~dasktune.dashboard.DashboardCallback` through the scheduler handler
:data:`HANDLER`, and by any ``"dasktune"`` events logged while no plugin listened.

Why a handler and not only the event log: the scheduler keeps the last 1,000 events of
each topic (``distributed.admin.low-level-log-length``) as a second copy, whatever
their size, and a flush carries a record of every trial that changed. At 100 trials
that copy grew the scheduler by about 7 MiB a minute until the ring was full, and it
grows with the number of trials; the state here is bounded by its own caps.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dasktune.dashboard._messages import TOPIC
from dasktune.dashboard._state import DashboardState

if TYPE_CHECKING:
    from distributed import Client, Scheduler

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dasktune-dashboard"
PAGE = "dasktune"
# The scheduler handler the driver sends its batched updates to.
HANDLER = "dasktune_dashboard"
_MARK = "_dasktune_dashboard"


class DasktuneDashboardPlugin(SchedulerPlugin):
    """Serve the dasktune page and JSON endpoints from the scheduler's dashboard.

    Registering it twice is a no-op (``idempotent``), so every Tuner on a cluster can
    register it and all their experiments appear on the one page. State lives on the
    scheduler, bounded by ``max_points`` per trial, ``max_experiment_points`` per
    experiment and ``max_experiments`` (see :class:`DashboardState`).
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, *, max_points: int = 2000, max_experiments: int = 50,
                 max_experiment_points: int = 200_000):
        self.max_points = max_points
        self.max_experiments = max_experiments
        self.max_experiment_points = max_experiment_points
        DashboardState(**self._settings())  # validate
        self.state: DashboardState | None = None
        self.scheduler: Scheduler | None = None
        self._bokeh_app: Any = None
        self._nav_pages: list[str] | None = None

    def _settings(self) -> dict[str, int]:
        return {"max_points": self.max_points, "max_experiments": self.max_experiments,
                "max_experiment_points": self.max_experiment_points}

    def __getstate__(self) -> dict[str, Any]:
        # Travels to the scheduler before start(): only the settings.
        return self._settings()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        previous = getattr(scheduler.handlers.get(HANDLER), "__self__", None)
        if isinstance(previous, DasktuneDashboardPlugin) and previous.state is not None \
                and previous._settings() == self._settings():
            # Re-registered (Dask's unregister does not call close()): the updates went
            # to the earlier instance until now, so its state is the whole story.
            self.state = previous.state
        else:
            self.state = DashboardState(**self._settings())
            # Experiments that began before the plugin arrived: replay what the event
            # log kept of them.
            for _, msg in scheduler.get_events(TOPIC):
                self.log_event(TOPIC, msg)
        scheduler.handlers[HANDLER] = self.receive
        if getattr(scheduler, "http_application", None) is not None:
            self._mount(scheduler)

    def receive(self, messages: list[Any] | tuple[Any, ...]) -> None:
        """The :data:`HANDLER` handler: apply a batch of messages, in order."""
        if not isinstance(messages, (list, tuple)):  # msgpack gives tuples
            logger.warning("dasktune dashboard: ignored a batch that is not a list")
            return
        for msg in messages:
            self.log_event(TOPIC, msg)

    def _mount(self, scheduler: Scheduler) -> None:
        from tornado.ioloop import IOLoop

        from dasktune.dashboard._api import api_routes

        try:
            from distributed.dashboard.core import BokehApplication
            from distributed.dashboard.scheduler import template_variables

            from dasktune.dashboard._page import dasktune_doc
        except ImportError as exc:  # no (compatible) Bokeh: JSON only
            logger.warning("dasktune dashboard page disabled (%s); JSON endpoints only", exc)
            scheduler.http_application.add_handlers(r".*", api_routes(self.state, "/"))
            return
        # Dask's unregister_scheduler_plugin does not call close(): drop a page an earlier
        # instance mounted, or it would keep answering with its stale state.
        applications = scheduler.http_application.applications
        applications[:] = [a for a in applications if not getattr(a, _MARK, False)]
        prefix = _dashboard_prefix(scheduler)
        variables = template_variables(scheduler)
        app = BokehApplication({f"/{PAGE}": functools.partial(dasktune_doc, self.state)},
                               scheduler, prefix=prefix, template_variables=variables)
        app.add_handlers(r".*", api_routes(self.state, prefix))
        setattr(app, _MARK, True)
        scheduler.http_application.add_application(app)
        app.initialize(IOLoop.current())
        app.start()
        self._bokeh_app = app
        # Dask's pages share this (memoized) list, so the link shows on every page.
        pages = variables.get("pages")
        if isinstance(pages, list) and PAGE not in pages:
            pages.append(PAGE)
            self._nav_pages = pages

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or self.state is None:
            return
        try:
            self.state.apply(msg)
        except ValueError as exc:
            logger.warning("dasktune dashboard: ignored a bad message: %s", exc)

    async def close(self) -> None:
        scheduler = self.scheduler
        if scheduler is not None and scheduler.handlers.get(HANDLER) == self.receive:
            # A driver that found the handler keeps sending to it: keep what it sends in
            # the event log, for a plugin registered later to replay.
            scheduler.handlers[HANDLER] = _to_event_log(scheduler)
        app, self._bokeh_app = self._bokeh_app, None
        if app is not None:
            app.stop(wait=False)
            applications = getattr(self.scheduler.http_application, "applications", [])
            if app in applications:
                applications.remove(app)
        if self._nav_pages is not None and PAGE in self._nav_pages:
            self._nav_pages.remove(PAGE)
        self._nav_pages = None


def _to_event_log(scheduler: Scheduler) -> Any:
    """:data:`HANDLER` once the plugin closed: it logs the messages as events instead.
    (A closure, not a partial: Dask logs its handlers' ``__name__``.)"""
    def to_event_log(messages: list[Any] | tuple[Any, ...]) -> None:
        for msg in messages if isinstance(messages, (list, tuple)) else ():
            scheduler.log_event(TOPIC, msg)

    return to_event_log


def listening(dask_scheduler: Scheduler) -> bool:
    """Whether the scheduler has the :data:`HANDLER` (run with ``run_on_scheduler``)."""
    return HANDLER in dask_scheduler.handlers


def _dashboard_prefix(scheduler: Scheduler) -> str:
    """The URL prefix of Dask's own Bokeh pages (``http_prefix``), default ``/``."""
    from bokeh.server.tornado import BokehTornado

    for app in getattr(scheduler.http_application, "applications", []):
        if isinstance(app, BokehTornado) and app.prefix:
            return app.prefix
    return "/"


def register_dashboard(client: Client, **plugin_options: Any) -> str:
    """Install the dasktune page on ``client``'s scheduler (once) and return its URL.

    ``plugin_options`` go to :class:`DasktuneDashboardPlugin` the first time only.
    """
    if not callable(getattr(client, "register_plugin", None)):
        raise TypeError(f"register_dashboard needs a distributed.Client, got "
                        f"{type(client).__name__}")
    client.register_plugin(DasktuneDashboardPlugin(**plugin_options), name=PLUGIN_NAME)
    return page_url(client.dashboard_link)


def page_url(dashboard_link: str | None) -> str | None:
    """``.../status`` (Dask's dashboard link) -> ``.../dasktune``."""
    if not dashboard_link:
        return None
    base = dashboard_link.split("?", 1)[0].rstrip("/")
    if base.endswith("/status"):
        base = base[: -len("/status")]
    return f"{base}/{PAGE}"
