"""A trial's side of gang reservations: its requests for workers, grants, and the
news of its gangs' workers (lost, retiring).

One :class:`GangDesk` per attempt, shared by two threads: the trial's (the user's code
calls :meth:`GangDesk.reserve`, :meth:`~GangDesk.release`, :meth:`~GangDesk.lost`,
:meth:`~GangDesk.retiring` through ``dasktune.session``) and the trial actor's, on the
worker's event loop, which hands the desk's notes to the driver in its poll replies
(:meth:`~GangDesk.take_notes`) and delivers the executor's answers and news
(:meth:`~GangDesk.grant`, :meth:`~GangDesk.refuse`, :meth:`~GangDesk.mark`). Nothing
here speaks Dask; the driver decides.

News of a gang's workers is :data:`LOST` (the worker left the cluster: the gang's slots
are free again) or :data:`RETIRING` (the worker is closing gracefully: its retirement
waits until the trial has checkpointed and released the gang -- a worker already
closing, up to ``dasktune.executor.evacuate-timeout``). Both are sticky: a retired
worker stays retiring once gone.

A note is ``("want", GangRequest)``, ``("withdraw", GangRequest)`` (a request whose
caller gave up waiting) or ``("release", gang_id)``.

An isolated trial (a child process, :mod:`dasktune.isolation`) has a desk of its own in
the child; the actor's desk then only relays: the child's notes come in through
:meth:`GangDesk.relay_notes`, and the driver's answers go back to the child through
:meth:`GangDesk.take_answers`, applied there by :meth:`GangDesk.apply_answers`. A gang reserved when the attempt
started (the driver learnt the experiment's gang shape) is handed to the first
:meth:`~GangDesk.reserve` if it asks for that shape, with no round trip; if it asks for
another, the reserved gang is given back.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dasktune.execution.gang_placement import check_strategy
from dasktune.execution.protocol import GangRequest, WorkerGang
from dasktune.resources import normalize_request

__all__ = ["LOST", "NEWS", "RETIRING", "GangDesk", "GangStopped", "normalize_bundles"]

LOST, RETIRING = "lost", "retiring"
NEWS = (LOST, RETIRING)  #: what :meth:`GangDesk.mark` may say of a gang's workers

_WAKE_S = 0.2  # how often a waiting reserve() looks whether the attempt was stopped
_ids = itertools.count(1)


class GangStopped(Exception):
    """The attempt ended (stopped, fenced or done) while its trial waited for workers."""


def normalize_bundles(bundles: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """``bundles`` as canonical resource dicts (``cpu`` -> ``CPU``); ValueError if it is
    not a non-empty list of resource dicts."""
    if isinstance(bundles, Mapping) or not isinstance(bundles, Sequence) or not bundles:
        raise ValueError(f"reserve_workers: bundles must be a non-empty list of resource "
                         f"dicts, one per worker, got {bundles!r}")
    out = []
    for i, bundle in enumerate(bundles):
        if not isinstance(bundle, Mapping):
            raise ValueError(f"reserve_workers: bundle {i} must be a dict, got {bundle!r}")
        out.append(normalize_request(bundle))
    return out


class _Waiting:
    __slots__ = ("error", "gang", "request")

    def __init__(self, request: GangRequest):
        self.request = request
        self.gang: WorkerGang | None = None
        self.error: str | None = None


class GangDesk:
    """The gang requests and grants of one attempt.

    Args:
        wake: wakes the actor's poll, so that a new note travels at once.
        stopped: whether the attempt must end (a waiting ``reserve`` gives up: a trial
            that waits for workers has nothing to checkpoint before a pause or a move).
        reserved: a gang the driver reserved for this attempt at its start.
    """

    def __init__(self, wake: Callable[[], None], stopped: Callable[[], bool],
                 reserved: WorkerGang | None = None):
        self._wake = wake
        self._stopped = stopped
        self._cond = threading.Condition()
        self._notes: list[tuple[str, Any]] = []
        self._waiting: dict[str, _Waiting] = {}
        self._reserved = reserved
        self._held: dict[str, WorkerGang] = {} if reserved is None else \
            {reserved.gang_id: reserved}
        self._news: dict[str, dict[str, list[str]]] = {what: {} for what in NEWS}
        self._lost = self._news[LOST]
        self._closed = False
        self._relayed = False  # the requests are a child process's: answers go to it
        self._answers: list[tuple[Any, ...]] = []

    # ------------------------------------------------------------ the trial's side
    def reserve(self, bundles: Sequence[Mapping[str, Any]], strategy: str = "PACK",
                timeout: float | None = None) -> WorkerGang:
        """Block until the driver granted every bundle; see ``session.reserve_workers``."""
        wanted = normalize_bundles(bundles)
        check_strategy(strategy)
        if timeout is not None and timeout < 0:
            raise ValueError(f"reserve_workers: timeout must be >= 0 or None, got {timeout!r}")
        with self._cond:
            ready, self._reserved = self._reserved, None  # offered once
            if ready is not None and ready.bundles == wanted and ready.strategy == strategy:
                return ready
            if ready is not None:
                # Another shape than the experiment's: the reserved gang must not be held
                # while this one waits (the trial would hold what it waits for).
                del self._held[ready.gang_id]
                self._notes.append(("release", ready.gang_id))
            request = GangRequest(f"r{next(_ids)}", wanted, strategy)
            waiting = self._waiting[request.request_id] = _Waiting(request)
            self._notes.append(("want", request))
        self._wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while waiting.gang is None and waiting.error is None:
                if self._closed or self._stopped():
                    self._give_up(request)
                    raise GangStopped("the trial was stopped while it waited for workers")
                left = _WAKE_S if deadline is None else min(_WAKE_S,
                                                             deadline - time.monotonic())
                if left <= 0:
                    self._give_up(request)
                    raise TimeoutError(f"reserve_workers: {len(wanted)} workers were not "
                                       f"granted within {timeout}s")
                self._cond.wait(left)
            del self._waiting[request.request_id]
            if waiting.error is not None:
                raise ValueError(waiting.error)
            assert waiting.gang is not None
            self._held[waiting.gang.gang_id] = waiting.gang
            return waiting.gang

    def _give_up(self, request: GangRequest) -> None:
        """(Under the lock.) Take ``request`` back; a grant that comes later is refused."""
        self._waiting.pop(request.request_id, None)
        self._notes.append(("withdraw", request))
        self._wake()

    def release(self, gang: WorkerGang) -> None:
        """Give ``gang``'s slots back (idempotent; a lost gang's are back already)."""
        with self._cond:
            if self._held.pop(gang.gang_id, None) is None:
                return
            if self._reserved is not None and self._reserved.gang_id == gang.gang_id:
                self._reserved = None
            if gang.gang_id in self._lost:
                return
            self._notes.append(("release", gang.gang_id))
        self._wake()

    def lost(self, gang: WorkerGang) -> list[str]:
        """The workers of ``gang`` that were lost ([] while it is whole)."""
        with self._cond:
            return list(self._lost.get(gang.gang_id, []))

    def retiring(self, gang: WorkerGang) -> list[str]:
        """The workers of ``gang`` that are retiring or retired ([] while none is)."""
        with self._cond:
            return list(self._news[RETIRING].get(gang.gang_id, []))

    def wait_lost(self, gang: WorkerGang, timeout: float | None = None) -> list[str]:
        """Wait up to ``timeout`` s for a worker of ``gang`` to be lost; :meth:`lost`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while gang.gang_id not in self._lost and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return list(self._lost.get(gang.gang_id, []))

    # ------------------------------------------------------------ the actor's side
    def has_notes(self) -> bool:
        with self._cond:
            return bool(self._notes)

    def take_notes(self) -> list[tuple[str, Any]]:
        """The notes for the driver since the last call."""
        with self._cond:
            notes, self._notes = self._notes, []
            return notes

    def grant(self, request_id: str, gang: WorkerGang) -> bool:
        """The driver granted ``request_id``: False if nobody waits for it any more."""
        with self._cond:
            waiting = self._waiting.get(request_id)
            if waiting is None or self._closed:
                return False
            if self._relayed:
                del self._waiting[request_id]
                self._answers.append(("grant", request_id, gang))
                return True
            waiting.gang = gang
            self._cond.notify_all()
            return True

    def refuse(self, request_id: str, why: str) -> None:
        """The request can never be met: its ``reserve`` raises ValueError(why)."""
        with self._cond:
            waiting = self._waiting.get(request_id)
            if waiting is not None and self._relayed:
                del self._waiting[request_id]
                self._answers.append(("refuse", request_id, why))
            elif waiting is not None:
                waiting.error = why
                self._cond.notify_all()

    def mark(self, what: str, gang_id: str, workers: list[str]) -> None:
        """News of ``workers`` of the gang ``gang_id``: :data:`LOST` (gone; the gang's
        slots are free again) or :data:`RETIRING` (closing gracefully)."""
        if what not in NEWS:
            raise ValueError(f"GangDesk.mark: {what!r} is not one of {NEWS}")
        with self._cond:
            known = self._news[what].setdefault(gang_id, [])
            known.extend(w for w in workers if w not in known)
            if self._relayed:
                self._answers.append((what, gang_id, list(workers)))
            self._cond.notify_all()

    def mark_lost(self, gang_id: str, workers: list[str]) -> None:
        """``workers`` of the gang ``gang_id`` are gone (its slots are free again)."""
        self.mark(LOST, gang_id, workers)

    def close(self) -> None:
        """The attempt ended: waiting calls give up (the executor frees its gangs)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------ relaying (isolated trials)
    def relay_notes(self, notes: list[tuple[str, Any]]) -> None:
        """The child process's notes: pass them on, and hold its requests for the
        driver's answers."""
        with self._cond:
            self._relayed = True
            for what, value in notes:
                if what == "want":
                    self._waiting[value.request_id] = _Waiting(value)
                elif what == "withdraw":
                    self._waiting.pop(value.request_id, None)
                self._notes.append((what, value))
        self._wake()

    def take_answers(self) -> list[tuple[Any, ...]]:
        """The driver's answers for the child process since the last call."""
        with self._cond:
            answers, self._answers = self._answers, []
            return answers

    def apply_answers(self, answers: list[tuple[Any, ...]]) -> None:
        """In the child: the driver's answers, as :meth:`take_answers` relayed them."""
        for answer in answers:
            if answer[0] == "grant":
                _, request_id, gang = answer
                if not self.grant(request_id, gang):
                    with self._cond:  # nobody waits any more: its slots go back
                        self._notes.append(("release", gang.gang_id))
                    self._wake()
            elif answer[0] == "refuse":
                self.refuse(answer[1], answer[2])
            elif answer[0] in NEWS:
                self.mark(answer[0], answer[1], answer[2])
