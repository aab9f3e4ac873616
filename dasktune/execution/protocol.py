"""The contract between the driver loop and whatever runs trials: :class:`Executor`.

The driver (:mod:`dasktune.driver`) decides; an executor runs. The driver only ever
talks to this protocol, so the same loop runs on a Dask cluster
(:class:`~dasktune.execution.dask_executor.DaskExecutor`) and on a virtual clock
(:class:`~dasktune.execution.simulated.SimulatedExecutor`), and both are held to one
conformance test (``tests/test_executor_conformance.py``).

What an executor tells the driver comes back from :meth:`Executor.events` as
:class:`ExecEvent` values of a few :class:`EventKind`\\ s; a trial's reports travel in them
as :class:`Report` values. Threading: every method is called from the driver's thread.

Gangs (trials that span several workers): a trial asks for worker bundles with
``dasktune.session.reserve_workers``; the request reaches the driver as a
WORKERS_WANTED event carrying a :class:`GangRequest`, the driver decides when (FIFO over
waiting requests) and where (:meth:`Executor.place_gang`), and the executor grants it
(:meth:`Executor.grant_workers`): the trial's call returns a :class:`WorkerGang`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["EventKind", "ExecEvent", "Executor", "GangRequest", "Report", "WorkerGang"]


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
    WORKERS_WANTED = "workers_wanted"  #: the attempt waits for the gang ``request``
    WORKERS_WITHDRAWN = "workers_withdrawn"  #: it waits no more for ``request`` (timeout)
    WORKERS_RELEASED = "workers_released"  #: the gang ``gang_id``'s slots are free again
    GANG_LOST = "gang_lost"  #: ``worker`` of the attempt's gang ``gang_id`` is gone


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


@dataclass(frozen=True)
class WorkerGang:
    """Worker slots granted to one trial together (all or none), one per bundle.

    ``workers[i]`` is the Dask worker address of bundle ``i`` (rank ``i``), ``hosts[i]``
    its host and ``devices[i]`` the GPU ids it was given (as a single-GPU trial gets
    them; ``[]`` without GPUs). Every bundle has a worker process of its own.
    """

    gang_id: str
    workers: list[str]
    hosts: list[str]
    devices: list[list[str]]
    bundles: list[dict[str, float]] = field(default_factory=list)
    strategy: str = "PACK"


@dataclass(frozen=True)
class GangRequest:
    """A trial's wish for worker bundles (Ray's placement-group strategies)."""

    request_id: str
    bundles: list[dict[str, float]]
    strategy: str = "PACK"


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
    request: GangRequest | None = None  # WORKERS_WANTED, WORKERS_WITHDRAWN
    gang_id: str = ""  # WORKERS_RELEASED, GANG_LOST


@runtime_checkable
class Executor(Protocol):
    """Runs trial attempts on workers; every method returns at once.

    Placement is the executor's: the driver asks :meth:`place` for a worker that can
    hold a request now and then :meth:`start`\\ s the attempt there; the executor
    accounts the attempt's resources until :meth:`release`. Every attempt started
    ends in exactly one FINISHED, LOST or START_FAILED event (or UNQUEUED for one
    queued with :meth:`queue_after` that never started), after which the driver calls
    :meth:`release`. A gang's workers are news to the trial that holds it, told by the
    executor (``session.gang_lost``, ``session.gang_retiring``): a worker lost frees the
    gang's slots (a GANG_LOST event); a retiring one is retired only once no attempt
    and no gang is on it (:meth:`retire_when_free`).
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
        """Retire ``addr`` (a retiring worker) if no attempt runs and no gang is held
        there now; False if not (the driver asks again when one ends or is released)."""

    def demand(self, trial_id: str, resources: dict[str, float],
               bundles: list[dict[str, float]] | None = None, strategy: str = "PACK") -> None:
        """Show an elastic cluster that ``trial_id`` waits for ``resources`` (its head);
        with ``bundles``, for its gang too (by ``strategy``, as :meth:`place_gang`
        places it; a running trial's head where it runs): the cluster is to grow by
        the workers they lack. Called again while the trial waits (the cluster changes);
        returns without waiting for the cluster."""

    def withdraw(self, trial_id: str) -> None:
        """``trial_id`` waits no more, nor does its gang (idempotent)."""

    def can_ever_fit_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                          head: dict[str, float] | None = None) -> str | None:
        """None if an idle cluster could hold ``bundles`` (with a ``head`` anywhere), else why."""

    def place_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                   head: dict[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        """A worker per bundle that can hold it now, all distinct, or None (all or none).
        With ``head``, the first address is where the head fits too (``head_worker``:
        it must fit there, where its attempt runs)."""

    def grant_workers(self, trial_id: str, bundles: list[dict[str, float]], strategy: str,
                      workers: list[str], request_id: str = "") -> WorkerGang:
        """Take ``workers`` (from :meth:`place_gang`) for ``trial_id``'s gang; with
        ``request_id``, hand it to the trial's waiting request (its head counts again);
        without, it is reserved for an attempt about to start (``TrialSpec.gang``)."""

    def refuse_workers(self, trial_id: str, request_id: str, why: str) -> None:
        """The request can never be met: the trial's ``reserve_workers`` raises ValueError."""

    def release_gang(self, gang_id: str) -> None:
        """Give a gang's slots back (idempotent); the attempt's end releases its gangs."""

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event so far, waiting up to ``timeout`` s for the first."""

    def shutdown(self) -> None:
        """Stop every attempt; the executor is not used again."""
