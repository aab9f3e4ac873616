"""The trial record and its status machine: pure data, no Dask.

A :class:`Trial` is owned by the driver loop (:mod:`dasktune.driver`). Searchers and
schedulers read it; only the controller changes its status, through
:meth:`Trial.set_status`, which refuses transitions the machine does not allow.
Everything a restore needs is in :meth:`Trial.to_state` / :meth:`Trial.from_state`
(plain JSON types; a config that JSON cannot carry exactly also goes along pickled),
so the experiment state never pickles live objects.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from dasktune.config import PlacementGroupFactory

logger = logging.getLogger(__name__)

PENDING = "PENDING"
RUNNING = "RUNNING"
PAUSED = "PAUSED"
TERMINATED = "TERMINATED"
ERROR = "ERROR"
FINISHED = frozenset((TERMINATED, ERROR))  # the statuses a trial does not leave by itself

_ALLOWED: dict[str, set[str]] = {
    PENDING: {RUNNING, TERMINATED, ERROR, PAUSED},
    RUNNING: {PENDING, PAUSED, TERMINATED, ERROR},
    PAUSED: {PENDING, RUNNING, TERMINATED, ERROR},
    TERMINATED: {PENDING},  # only a restore with restart/resume re-opens a trial
    ERROR: {PENDING},
}


# Auto-filled numbers nobody ranks trials by: no min/max/avg kept for them (saves a
# third of the per-result bookkeeping; their last value is in ``last_result``).
_NOT_ANALYSED = frozenset({"timestamp", "pid", "iterations_since_restore",
                           "time_since_restore", "done"})


@dataclass
class Placement:
    """One attempt of a trial on one worker (the dashboard's Gantt rows)."""

    attempt: int
    worker: str
    host: str
    start: float
    end: float | None = None
    outcome: str | None = None  # "done", "error", "lost", "paused", "stopped"
    # The workers of the gang the attempt holds (dasktune.session.reserve_workers), in
    # rank order, and since when; [] without one.
    gang: list[str] = field(default_factory=list)
    gang_start: float | None = None


@dataclass
class Trial:
    """One configuration under evaluation.

    ``attempt`` increments each time the trial is (re)started as a new actor; reports
    carry it, and the controller drops reports whose attempt is not the current one
    (a zombie after a partition). ``num_failures`` counts errors in user code,
    ``num_restarts`` counts lost hosts; they are budgeted separately.
    """

    trial_id: str
    config: dict[str, Any]
    experiment_tag: str = ""
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    status: str = PENDING
    last_result: dict[str, Any] = field(default_factory=dict)
    metric_analysis: dict[str, dict[str, float]] = field(default_factory=dict)
    metric_n_steps: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    checkpoint: str | None = None  # path of the newest committed checkpoint
    checkpoint_iteration: int = 0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    num_failures: int = 0
    num_restarts: int = 0
    attempt: int = 0
    error_msg: str | None = None
    error_file: str | None = None
    placements: list[Placement] = field(default_factory=list)
    start_time: float | None = None
    end_time: float | None = None
    stop_reason: str | None = None
    # Where a scheduler stopped it early: {"time_attr": ..., "value": ...} (the rung).
    stop_rung: dict[str, Any] | None = None
    # Set by a scheduler (PBT exploit) so the next start restores this checkpoint.
    restore_path: str | None = None
    evaluated_params: dict[str, Any] = field(default_factory=dict)
    # Folder of the trial in the experiment's storage (set by the controller).
    path: str | None = None
    # Highest training_iteration already logged: re-executed iterations after a
    # restart are not logged twice.
    logged_iteration: int = 0
    # Ray's ``trial.trainable_name`` (read by users' trial_name_creator functions).
    trainable_name: str = ""
    # From TuneConfig(trial_name_creator=/trial_dirname_creator=), when given.
    custom_trial_name: str | None = None
    custom_dirname: str | None = None

    # ------------------------------------------------------------------ naming
    @property
    def trial_name(self) -> str:
        if self.custom_trial_name:
            return self.custom_trial_name
        tag = f"_{self.experiment_tag}" if self.experiment_tag else ""
        return f"trial_{self.trial_id}{tag}"

    @property
    def dirname(self) -> str:
        """Folder of the trial under the experiment (Ray: ``<trainable>_<id>_<tag>``)."""
        if self.custom_dirname:
            return self.custom_dirname
        name = f"{self.trial_id}_{self.experiment_tag}" if self.experiment_tag else self.trial_id
        return _safe(name)[:120]

    def __str__(self) -> str:
        return self.trial_name  # Ray: str(trial) is its name

    @property
    def lost_its_worker(self) -> bool:
        """Whether its newest attempt ended because its worker was lost (a move, not a
        failure of its code)."""
        return bool(self.placements) and self.placements[-1].outcome == "lost"

    @property
    def placement_group_factory(self) -> PlacementGroupFactory:
        """Ray's name for the trial's current resources (one bundle: one actor)."""
        return PlacementGroupFactory([dict(self.resources)])

    # --------------------------------------------------------------- status
    def set_status(self, status: str) -> None:
        if status == self.status:
            return
        if status not in _ALLOWED[self.status]:
            raise ValueError(f"trial {self.trial_id}: illegal transition {self.status} -> {status}")
        self.status = status
        now = time.time()
        if status == RUNNING and self.start_time is None:
            self.start_time = now
        if status in FINISHED:
            self.end_time = now

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    # --------------------------------------------------------------- results
    def update_last_result(self, result: dict[str, Any]) -> None:
        """Record a result and keep min/max/avg/last(-5/-10) per numeric metric.

        A NaN is recorded as ``last`` (and enters the averages, as in Ray), so a trial
        whose metric turned NaN cannot win with an older value; ``min``/``max`` skip
        NaN so they stay each trial's best finite-or-inf value seen.
        """
        self.last_result = result
        analysis, steps = self.metric_analysis, self.metric_n_steps
        for key, value in result.items():
            if key in _NOT_ANALYSED:
                continue
            cls = value.__class__
            # Exact-type test first: this runs for every key of every result.
            if cls is not float and cls is not int and \
                    (cls is bool or not isinstance(value, (int, float))):
                continue
            stats = analysis.get(key)
            if stats is None:
                analysis[key] = {"max": value, "min": value, "avg": value, "last": value,
                                 "last-5-avg": value, "last-10-avg": value, "count": 1}
                steps[key] = {"10": [value]}
                continue
            n = stats["count"] + 1
            stats["count"] = n
            if value == value:  # not NaN
                best = stats["max"]
                if value > best or best != best:
                    stats["max"] = value
                best = stats["min"]
                if value < best or best != best:
                    stats["min"] = value
            stats["avg"] += (value - stats["avg"]) / n
            stats["last"] = value
            # One window of the last 10 values; the last 5 are its tail.
            buf = steps.setdefault(key, {}).setdefault("10", [])
            buf.append(value)
            if len(buf) > 10:
                del buf[0]
            stats["last-10-avg"] = sum(buf) / len(buf)
            tail = buf[-5:]
            stats["last-5-avg"] = sum(tail) / len(tail)

    # --------------------------------------------------------------- state
    def to_state(self) -> dict[str, Any]:
        """JSON-able snapshot for the experiment state file."""
        state = {k: v for k, v in self.__dict__.items()
                 if k != "placements" and not k.startswith("_")}
        state["placements"] = [p.__dict__ for p in self.placements]
        state["config_pickle"] = self._config_pickle()
        return state

    def _config_pickle(self) -> str | None:
        """The config, cloudpickled (base64), when JSON would not give it back as it is
        (a class or function from ``tune.choice``, tuples, NaN): a restored trial must
        resume with the very values it started with. Computed once per config."""
        cached = self.__dict__.get("_pickled")
        if cached is not None and cached[0] is self.config:
            return cached[1]
        try:
            exact = json.loads(json.dumps(self.config)) == self.config
        except (TypeError, ValueError):
            exact = False
        blob = None
        if not exact:
            try:
                blob = base64.b64encode(cloudpickle.dumps(self.config)).decode()
            except Exception:  # noqa: BLE001 - unpicklable: the JSON rendering is all there is
                blob = None
        self.__dict__["_pickled"] = (self.config, blob)
        return blob

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Trial:
        state = dict(state)
        placements = [Placement(**p) for p in state.pop("placements", [])]
        blob = state.pop("config_pickle", None)
        known = {f for f in cls.__dataclass_fields__}
        trial = cls(**{k: v for k, v in state.items() if k in known})
        trial.placements = placements
        if blob:
            try:
                trial.config = cloudpickle.loads(base64.b64decode(blob))
            except Exception as exc:  # noqa: BLE001 - e.g. a class no longer importable
                logger.warning("trial %s: its exact config could not be loaded (%r); "
                               "using the JSON rendering", trial.trial_id, exc)
        return trial

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"


def _safe(name: str) -> str:
    out = []
    for ch in name:
        out.append(ch if ch.isalnum() or ch in "-_.=," else "_")
    return "".join(out)
