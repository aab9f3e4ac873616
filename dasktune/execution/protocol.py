"""The contract between the driver loop and whatever runs trials: :class:`Executor`.

The driver (:mod:`dasktune.driver`) decides; an executor runs. The driver only ever
talks to this protocol, so the same loop runs on a Dask cluster
(:class:`~dasktune.execution.dask_executor.DaskExecutor`) and on a virtual clock
(:class:`~dasktune.execution.simulated.SimulatedExecutor`), and both are held to one
conformance test (``tests/test_executor_conformance.py``).

What an executor tells the driver comes back from :meth:`Executor.events` as
:class:`ExecEvent` values of a few :class:`EventKind`\\ s; a trial's reports travel in them
as :class:`Report` values. Threading: every method is called from the driver's thread.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["EventKind", "ExecEvent", "Executor", "Report"]


class EventKind(enum.Enum):
    """What happened; attempt events name a trial and attempt, worker events a worker."""

    STARTED = "started"  #: the attempt runs (``worker``, ``host`` say where)
    REPORTS = "reports"  #: some of its reports
    FINISHED = "finished"  #: it ended (``error``: the user's code raised), last reports
    LOST = "lost"  #: its worker or actor is gone; nothing more will come
    START_FAILED = "start_failed"  #: it could not be started (``error`` says why)
    UNQUEUED = "unqueued"  #: a queued attempt (``queue_after``) will not start: start anew
    WORKER_LOST = "worker_lost"  #: ``worker`` left the cluster
    WORKER_RETIRING = "worker_retiring"  #: ``worker`` is closing: move its trials
    WORKER_ADDED = "worker_added"  #: ``worker`` joined: waiting trials may be placed


@dataclass(frozen=True, slots=True)
class Report:
    """One report of an attempt: a result, a committed checkpoint, or both.

    ``seq`` counts the attempt's reports from 1; ``result`` is None for a
    checkpoint-only report (a pause or a move); ``checkpoint`` is the committed
    checkpoint's path in storage, if the report came with one.
    """

    seq: int
    result: dict[str, Any] | None
    checkpoint: str | None


@dataclass
class ExecEvent:
    """Something that happened to one attempt of one trial, or to one worker."""

    kind: EventKind
    trial_id: str = ""
    attempt: int = 0
    reports: list[Report] = field(default_factory=list)
    error: str | None = None
    worker: str = ""
    host: str = ""


@runtime_checkable
class Executor(Protocol):
    """Runs trial attempts on workers; every method returns at once.

    Placement is the executor's: the driver asks :meth:`place` for a worker that can
    hold a request now and then :meth:`start`\\ s the attempt there; the executor
    accounts the attempt's resources until :meth:`release`. Every attempt started
    ends in exactly one FINISHED, LOST or START_FAILED event (or UNQUEUED for one
    queued with :meth:`queue_after` that never started), after which the driver calls
    :meth:`release`.
    """

    #: Whether :meth:`queue_after` can ever queue (the driver skips asking if not).
    can_queue: bool

    @property
    def num_running(self) -> int:
        """Attempts started and not yet released."""

    def workers(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """Live workers by address, each with at least its ``host``."""

    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        """None if some worker could hold ``resources`` when idle, else why not."""

    def place(self, resources: dict[str, float]) -> str | None:
        """A worker that can hold ``resources`` now (and may run trials), or None."""

    def start(self, spec: TrialSpec, resources: dict[str, float], worker: str,
              params: dict[str, Any] | None = None) -> None:
        """Start the attempt ``spec`` on ``worker`` (from :meth:`place`)."""

    def stop(self, trial_id: str, checkpoint: bool = False) -> None:
        """Ask an attempt to end: now, or after its next checkpoint."""

    def checkpoint(self, trial_id: str) -> None:
        """Ask a running attempt for a checkpoint after its step in flight."""

    def release(self, trial_id: str) -> None:
        """Forget an ended attempt and free its resources (idempotent)."""

    def queue_after(self, running_id: str, spec: TrialSpec) -> bool:
        """Queue ``spec`` to start where ``running_id`` runs, when it ends; False if not."""

    def unqueue(self, trial_id: str) -> None:
        """Take a queued attempt back (an UNQUEUED event follows unless it started)."""

    def running_on(self, addr: str) -> list[str]:
        """The trials whose attempts run on ``addr``."""

    def lose_worker(self, addr: str) -> list[str]:
        """``addr`` is gone: every attempt there ends in a LOST event; returns them."""

    def retire_when_free(self, addr: str) -> bool:
        """Retire ``addr`` (a retiring worker) once no attempt runs there."""

    def demand(self, trial_id: str, resources: dict[str, float]) -> None:
        """Show an elastic cluster that ``trial_id`` waits for ``resources``."""

    def withdraw(self, trial_id: str) -> None:
        """``trial_id`` waits no more (idempotent)."""

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event so far, waiting up to ``timeout`` s for the first."""

    def shutdown(self) -> None:
        """Stop every attempt; the executor is not used again."""
