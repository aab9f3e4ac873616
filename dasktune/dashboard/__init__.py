"""The live dasktune page in the Dask dashboard, its JSON endpoints, and the static server.

Data path: :class:`DashboardCallback` (driver) batches trial updates into messages and
sends each batch to the scheduler handler that :class:`DasktuneDashboardPlugin` adds
(or, with no plugin there, to the ``"dasktune"`` event topic, which a plugin registered
later replays); the plugin keeps them in a bounded state and serves ``/dasktune`` and
``/dasktune/api/{experiments,trials}`` from Dask's dashboard. :func:`serve_static`
serves the same page for experiments read back from storage.
"""

from __future__ import annotations

from dasktune.dashboard._callback import DashboardCallback
from dasktune.dashboard._messages import TOPIC
from dasktune.dashboard._plugin import DasktuneDashboardPlugin, register_dashboard
from dasktune.dashboard._state import DashboardState
from dasktune.dashboard._static import StaticDashboard, load_experiment, serve_static

__all__ = [
    "TOPIC",
    "DashboardCallback",
    "DashboardState",
    "DasktuneDashboardPlugin",
    "StaticDashboard",
    "load_experiment",
    "register_dashboard",
    "serve_static",
]
