"""Fault handling on the cluster side: a scheduler plugin that reports lost and
retiring workers to the driver at once.

Dask actors have no resilience: when a worker dies its actors are gone, and a
worker that holds an actor refuses to retire. So trial state never lives only in
an actor (checkpoints and results are in storage), and this plugin tells the
driver what happened to the workers, within milliseconds rather than at the next
failed poll:

- ``remove_worker``: the worker left (SIGKILL, OOM, spot reclaim, lost network
  past ``distributed.scheduler.worker-ttl``). The driver restarts its trials on
  other workers from their newest committed checkpoints.
- a worker's status changing to ``closing_gracefully`` (``retire_workers``,
  adaptive downscaling, SIGTERM from a spot notice): the driver checkpoints its
  trials there, moves them, and then asks for the retirement again, which Dask
  refused while the actors were on the worker.

Events go to the driver through ``log_event`` on the topic :data:`TOPIC`. The
plugin keeps no trial state of its own; it only needs ``dasktune`` importable on
the scheduler (``pip install dasktune`` there, as for any plugin).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

if TYPE_CHECKING:
    from distributed import Scheduler

TOPIC = "dasktune-cluster"
PLUGIN_NAME = "dasktune-recovery"


class RecoveryPlugin(SchedulerPlugin):
    """Publishes worker departures and retirements on :data:`TOPIC`."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def _send(self, msg: dict[str, Any]) -> None:
        if self.scheduler is not None:
            self.scheduler.log_event(TOPIC, {**msg, "time": time.time()})

    def add_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        self._send({"op": "add-worker", "worker": worker})

    def remove_worker(self, scheduler: Scheduler, worker: str, *, stimulus_id: str = "",
                      **kwargs: Any) -> None:
        self._send({"op": "remove-worker", "worker": worker, "stimulus_id": stimulus_id,
                    "expected": bool(kwargs.get("expected", False))})

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        # Worker status changes are logged on the worker's own topic (its address).
        if not isinstance(msg, dict) or msg.get("action") != "worker-status-change":
            return
        if msg.get("status") == "closing_gracefully":
            self._send({"op": "retiring", "worker": topic})


def register(client: Any) -> bool:
    """Install the plugin on ``client``'s scheduler; False (and a warning) if it can't be."""
    import logging

    try:
        client.register_plugin(RecoveryPlugin(), name=PLUGIN_NAME)
        return True
    except Exception as exc:  # noqa: BLE001 - fall back to detection by failed polls
        logging.getLogger(__name__).warning(
            "could not register the dasktune recovery plugin on the scheduler (%r); lost "
            "workers are noticed at the next failed poll instead. Install dasktune where the "
            "scheduler runs.", exc)
        return False
