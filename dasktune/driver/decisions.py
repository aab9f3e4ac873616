"""Typed decisions: what a scheduler said, and what the driver is doing to an attempt.

Schedulers answer with a :class:`~dasktune.schedulers.Decision`, an
:class:`~dasktune.schedulers.Exploit` or a :class:`~dasktune.schedulers.Reconfigure` (a user's scheduler may still return Ray's strings);
:func:`decide` turns any of those, and the driver's own reasons to end a trial, into one
:data:`Verdict` value, so the loop matches on types and never compares strings.

While an attempt winds down (stopped, paused, exploited or moved), the driver remembers
why as a :class:`Winding`: the reason decides what happens at its end. Who ended a trial
is an :class:`EndedBy`, recorded in the trial's end marker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from dasktune.schedulers import Decision, Exploit, Reconfigure

__all__ = ["Continue", "EndedBy", "Pause", "Stop", "Verdict", "Winding", "decide"]


@dataclass(frozen=True)
class Continue:
    """Keep running (``CONTINUE``, ``NOOP`` or no decision)."""


@dataclass(frozen=True)
class Pause:
    """Checkpoint (unless this result came with one), stop, and mark the trial PAUSED."""


class EndedBy(enum.Enum):
    """Who ended a trial. Every end is recorded in the trial's end marker
    (:meth:`~dasktune.storage.ExperimentStorage.write_trial_end`): by the worker when the
    trial ended itself, by the driver otherwise, so a restore never runs it again."""

    TRAINABLE = "trainable"  #: it returned, or its result said ``done`` (the stop dict)
    SCHEDULER = "scheduler"  #: the scheduler's ``STOP``: stopped early, at a rung
    STOPPER = "stopper"  #: a :class:`~dasktune.stopper.Stopper` the driver asked
    EXPERIMENT = "experiment"  #: the experiment ended (time budget, ``stop_all``, fail_fast)


@dataclass(frozen=True)
class Stop:
    """End the trial; ``by`` says who decided it."""

    by: EndedBy  #: ``EndedBy.SCHEDULER``: stopped early


#: What the driver does with a trial after one of its results.
Verdict = Continue | Pause | Stop | Exploit | Reconfigure

_CONTINUE, _PAUSE = Continue(), Pause()
_BY_DECISION: dict[Decision, Verdict] = {
    Decision.CONTINUE: _CONTINUE, Decision.NOOP: _CONTINUE, Decision.PAUSE: _PAUSE,
    Decision.STOP: Stop(EndedBy.SCHEDULER),
}


def decide(raw: Any, trial_id: str) -> Verdict:
    """The verdict for a scheduler's answer ``raw`` about ``trial_id``.

    Raises:
        ValueError: ``raw`` is no decision a scheduler may return.
    """
    if raw is None:
        return _CONTINUE
    if isinstance(raw, (Exploit, Reconfigure)):
        return raw
    try:
        # A Decision hashes and compares as its string: Ray's strings find it too.
        verdict = _BY_DECISION.get(raw)
    except TypeError:  # unhashable: no decision
        verdict = None
    if verdict is None:
        raise ValueError(f"scheduler returned an unknown decision {raw!r} for {trial_id}")
    return verdict


class Winding(enum.Enum):
    """Why a RUNNING attempt is winding down; its end is handled accordingly."""

    STOPPING = "stopping"  #: ended (TERMINATED/ERROR): wait for the actor to finish
    PAUSING = "pausing"  #: checkpoint, then PAUSED
    EXPLOITING = "exploiting"  #: PBT: restart with a new config from a donor checkpoint
    MOVING = "moving"  #: restart from the newest checkpoint elsewhere (a graceful move)
    #: a Reconfigure at a checkpointed result: PAUSED with the new settings; the attempt's
    #: later results are not its lineage (the restart runs them again with the new ones)
    RECONFIGURING = "reconfiguring"
