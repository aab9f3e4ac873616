"""One attempt's record on the Dask executor, and the events it sends the driver.

:class:`Run` is what :class:`~dasktune.execution.dask_executor.DaskExecutor` keeps of
an attempt it started (or queued): its worker, its actor's key and future, the
coroutine that polls it, its place in a queued line. :class:`EventItem` carries an
event through the executor's queue with what the executor needs back from the driver.
The small helpers name an attempt to its actor (:func:`fence_of`) and build its
STARTED event.
"""

from __future__ import annotations

import asyncio
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune.actor import attempt_key
from dasktune.execution.protocol import EventKind, ExecEvent

if TYPE_CHECKING:
    from distributed import Future

    from dasktune.session import TrialSpec

__all__ = ["EventItem", "Run", "cancel_run", "fence_of", "format_remote_error", "settled",
           "started_event"]


@dataclass
class EventItem:
    """An event on its way to the driver, with what the executor needs back from it."""

    event: ExecEvent
    # Set (on the client loop) once the driver has taken the event (the poll's
    # back-pressure: see dask_polling).
    taken: asyncio.Event | None = None
    # FINISHED: the queued attempt that took over the actor in the same reply, and where.
    successor: tuple[str, dict[str, Any]] | None = None


@dataclass
class Run:
    spec: TrialSpec
    worker: str
    resources: dict[str, float]
    key: str
    future: Future | None = None
    task: asyncio.Future[Any] | None = None
    started: bool = False
    finished: bool = False  # its actor's thread ended cleanly: the actor can be reused
    next: Run | None = None  # queued behind this attempt on its actor (loop thread only)
    prev: Run | None = None  # the attempt this one is queued behind
    enqueued: asyncio.Future[bool] | None = None  # the actor's answer to enqueue
    cancelled: bool = False  # the executor cancelled its task (released, or worker lost)
    # Gang requests the trial waits for: while any waits, its head's resources
    # (but GPUs) are lent back to the ledger (driver thread only).
    waiting: set[str] = field(default_factory=set)


async def settled(future: Future) -> None:
    """Wait until ``future`` is done, without fetching its value.

    ``await future`` would gather the actor's handle, which we never use, through the
    client's gather that concurrent awaiters share: cancelling any one of them (a trial
    released while its actor was being created) cancels that shared gather under all the
    others. Dask's own ``wait`` waits on the same state.
    """
    await future._state.wait()


def started_event(trial_id: str, run: Run, where: dict[str, Any]) -> ExecEvent:
    """The STARTED event of ``run``, from what its actor said of where it runs."""
    return ExecEvent(EventKind.STARTED, trial_id, run.spec.attempt, worker=where.get("worker", run.worker),
                     host=where.get("host", ""))


def fence_of(run: Run) -> str:
    """How the actor's methods name ``run`` (its thread may have gone on to the next)."""
    return attempt_key(run.spec)


def cancel_run(run: Run) -> None:
    """Cancel ``run``'s coroutine, marked as the executor's doing (see ``AttemptPolling._drive``)."""
    if run.task is not None and not run.task.done():
        run.cancelled = True
        run.task.cancel()



def format_remote_error(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
