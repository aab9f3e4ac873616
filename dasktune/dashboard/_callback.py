"""The driver's side of the live page: a callback that batches updates into events."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from dasktune.callback import Callback
from dasktune.dashboard._messages import (
    EXPERIMENT,
    FINISHED,
    RESULTS,
    RUNNING,
    TOPIC,
    TRIALS,
    better,
    check_metric_mode,
    experiment_message,
    result_point,
    trial_record,
)
from dasktune.dashboard._plugin import HANDLER, listening

if TYPE_CHECKING:
    from distributed import Client

    from dasktune.trial import Trial

logger = logging.getLogger(__name__)

# Past this many buffered points a flush is due whatever the period, to bound memory.
_MAX_BUFFERED_POINTS = 5000


class DashboardCallback(Callback):
    """Send trial updates and results to the dashboard plugin on the scheduler.

    Updates are batched: a flush happens in :meth:`on_step_end` at most every
    ``flush_interval`` seconds, and once more in :meth:`on_experiment_end`. A flush sends
    the experiment summary (when it changed, e.g. when it starts or stops waiting for
    resources), full records of the trials that changed, and the new values of
    ``experiment_info["metric"]``.

    ``experiment_info`` keys: ``name``, ``storage`` (a URI; credentials are stripped),
    ``searcher``, ``scheduler`` (objects or names), ``metric``, ``mode`` (``"min"`` or
    ``"max"``), optionally ``experiment_id`` (default: the name plus a random suffix) and
    ``start_time``. Config keys that look secret are masked before anything is sent.

    A flush is one call to the plugin's scheduler handler when
    :class:`~dasktune.dashboard.DasktuneDashboardPlugin` is registered (checked once),
    else one ``client.log_event("dasktune", ...)`` per message: the plugin replays the
    event log when it arrives. The dashboard is best-effort: a failed send is logged and
    dropped, never raised into the tuning loop.

    Curves are thinned at the source, so what the plugin receives grows with the
    logarithm of the report count, not with it: a trial's first ``points_per_trial``
    values are all sent, then every 2nd, every 4th, ... as its count doubles; a value that
    improves the experiment's best, and a trial's newest value at each flush, are always
    sent.
    """

    def __init__(self, client: Client, experiment_info: dict[str, Any], *,
                 flush_interval: float = 0.5, points_per_trial: int = 500):
        if not callable(getattr(client, "log_event", None)):
            raise TypeError(f"DashboardCallback needs a distributed.Client, got "
                            f"{type(client).__name__}")
        if not isinstance(experiment_info, dict):
            raise TypeError(f"experiment_info must be a dict, got "
                            f"{type(experiment_info).__name__}")
        check_metric_mode(experiment_info.get("metric"), experiment_info.get("mode"))
        if not isinstance(flush_interval, (int, float)) or flush_interval < 0:
            raise ValueError(f"flush_interval must be a number >= 0, got {flush_interval!r}")
        self.client = client
        self.info = dict(experiment_info)
        self.info.setdefault("start_time", time.time())
        name = str(self.info.get("name") or "experiment")
        self.experiment_id = str(self.info.get("experiment_id")
                                 or f"{name}-{uuid.uuid4().hex[:8]}")
        self.metric: str | None = self.info.get("metric")
        self.mode: str | None = self.info.get("mode")
        self.flush_interval = float(flush_interval)
        if not isinstance(points_per_trial, int) or points_per_trial < 1:
            raise ValueError(f"points_per_trial must be an int >= 1, got {points_per_trial!r}")
        self.points_per_trial = points_per_trial
        # trial id -> [values seen, newest value not sent]; the experiment's best value
        self._thin: dict[str, list[Any]] = {}
        self._best: float | None = None
        self._status = RUNNING
        self._end_time: float | None = None
        self._info_dirty = True
        self._dirty: dict[str, Trial] = {}
        self._sent: dict[str, tuple[Any, ...]] = {}  # trial id -> signature last sent
        self._points: list[list[Any]] = []
        self._last_flush = float("-inf")
        self._warned = False
        self._status_line: Any = None  # the controller's, given to setup()
        self._waiting: str | None = None
        self._to_plugin: bool | None = None  # see _send

    # ----------------------------------------------------------------- hooks
    def setup(self, stop: Any = None, num_samples: int | None = None,
              total_num_samples: int | None = None, **info: Any) -> None:
        # The console's note ("waiting for resources: ..."): the page shows the same.
        self._status_line = getattr(info.get("controller"), "status_line", None)
        self.flush()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if time.monotonic() - self._last_flush < self.flush_interval:
            return
        waiting = self._waiting_note()
        if waiting != self._waiting:
            self._waiting, self._info_dirty = waiting, True
        # Catch trials whose state changed without a hook (e.g. new PENDING trials); only
        # when sending, so a step costs O(1) and not O(trials).
        for trial in trials:
            if self._sent.get(trial.trial_id) != _signature(trial):
                self._dirty[trial.trial_id] = trial
        self.flush()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        self._dirty[trial.trial_id] = trial

    on_trial_restore = on_trial_save = on_trial_recover = on_trial_start

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        self.on_trial_start(iteration, trials, trial, **info)
        self._end_curve(trial)

    on_trial_error = on_trial_complete

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict[str, Any], **info: Any) -> None:
        self._dirty[trial.trial_id] = trial
        t = result.get("timestamp")
        point = result_point(trial.trial_id, result, self.metric,
                             t if isinstance(t, (int, float)) else time.time())
        if point is None:
            return
        seen = self._thin.get(trial.trial_id)
        if seen is None:
            seen = self._thin[trial.trial_id] = [0, None]
        count = seen[0]
        seen[0] = count + 1
        level = count // self.points_per_trial
        stride = 1 << level.bit_length()  # 1, then 2, 4, 8, ... as the count doubles
        value = point[2]
        improves = self.mode is not None and better(value, self._best, self.mode)
        if improves:
            self._best = value
        if count % stride == 0 or improves:
            self._points.append(point)
            seen[1] = None
        else:
            seen[1] = point
        if len(self._points) >= _MAX_BUFFERED_POINTS:
            self.flush()

    def _end_curve(self, trial: Trial) -> None:
        """A trial ended: its newest value goes out with the next flush."""
        seen = self._thin.pop(trial.trial_id, None)
        if seen is not None and seen[1] is not None:
            self._points.append(seen[1])

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._status = FINISHED
        self._end_time = time.time()
        self._waiting = None
        self._info_dirty = True
        for trial in trials:
            self._dirty[trial.trial_id] = trial
        self.flush()

    # ----------------------------------------------------------------- sending
    def flush(self) -> None:
        """Send what changed since the last flush, now."""
        self._last_flush = time.monotonic()
        messages = []
        if self._info_dirty:
            messages.append(experiment_message(self.experiment_id, self.info,
                                               status=self._status, end_time=self._end_time,
                                               waiting=self._waiting))
        if self._dirty:
            records = [trial_record(t, self.metric, self.mode) for t in self._dirty.values()]
            messages.append({"type": TRIALS, "experiment_id": self.experiment_id,
                             "trials": records})
        for seen in self._thin.values():  # each live curve reaches its newest value
            if seen[1] is not None:
                self._points.append(seen[1])
                seen[1] = None
        if self._points:
            messages.append({"type": RESULTS, "experiment_id": self.experiment_id,
                             "points": self._points})
        sent = {tid: _signature(t) for tid, t in self._dirty.items()}
        self._info_dirty, self._dirty, self._points = False, {}, []
        try:
            if messages:
                self._send(messages)
        except Exception as exc:  # noqa: BLE001 - the dashboard must never stop a run
            self._info_dirty = self._info_dirty or messages[0]["type"] == EXPERIMENT
            if not self._warned:
                logger.warning("dasktune dashboard: could not send updates (%s: %s); "
                               "the page may lag", type(exc).__name__, exc)
                self._warned = True
            return
        self._sent.update(sent)

    def _send(self, messages: list[dict[str, Any]]) -> None:
        """One batch to the dashboard plugin's handler where it listens, else each message
        to the scheduler's event log (a plugin registered later replays that)."""
        if self._to_plugin is None:
            self._to_plugin = self._plugin_listens()
        if self._to_plugin:
            self.client.sync(getattr(self.client.scheduler, HANDLER), messages=messages)
            return
        for msg in messages:
            pending = self.client.log_event(TOPIC, msg)
            if inspect.isawaitable(pending):  # an asynchronous client: don't block the loop
                asyncio.ensure_future(pending)

    def _plugin_listens(self) -> bool:
        """Asked once: whether the scheduler has the dashboard plugin's handler."""
        if getattr(self.client, "asynchronous", False):
            return False  # no blocking call on an event loop: the event log serves
        try:
            return bool(self.client.run_on_scheduler(listening))
        except Exception as exc:  # noqa: BLE001 - e.g. run_function blocked: use the log
            logger.debug("dasktune dashboard: no plugin handler found (%r)", exc)
            return False

    def _waiting_note(self) -> str | None:
        """The controller's note while the experiment waits for resources, else None."""
        if self._status_line is None:
            return None
        try:
            line = self._status_line()
        except Exception:  # noqa: BLE001 - the dashboard must never stop a run
            return None
        return line if isinstance(line, str) and line.startswith("waiting") else None


def _signature(trial: Trial) -> tuple[Any, ...]:
    """What the page shows of a trial changes only if one of these changes."""
    placement = trial.placements[-1] if trial.placements else None
    return (trial.status, trial.last_result.get("training_iteration"), trial.num_restarts,
            trial.num_failures, len(trial.placements),
            None if placement is None else (placement.end, placement.outcome))
