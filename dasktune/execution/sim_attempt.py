"""One simulated attempt of a trial: its model's iterations turned into reports.

A :class:`SimAttempt` holds where an attempt of a simulated trial stands (the iteration
in flight, its totals, its checkpoints, a driver's stop) and, when the executor's clock
reaches the end of an iteration, makes that iteration's reports as the real attempt
runner would: Ray's auto fields (:func:`~dasktune.result.fill_auto_fields`, on the virtual
clock), the ``stop`` dict (:func:`~dasktune.session.stop_dict_hit`), the checkpoint
policy (:func:`~dasktune.attempt.checkpoint_due`) and, on ``stop(checkpoint=True)``, a
checkpoint-only report after the iteration in flight, as a class trainable does
(the runner's checkpoint-only save). Checkpoints are names only: nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dasktune.attempt import checkpoint_due
from dasktune.execution.protocol import EventKind, Report
from dasktune.layout import checkpoint_dir_name
from dasktune.result import fill_auto_fields, format_date
from dasktune.session import stop_dict_hit

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["EPOCH", "SimAttempt", "StopRequest"]

EPOCH = 1_700_000_000.0  #: virtual time 0 as a wall-clock timestamp (fixed: reproducible)


class StopRequest:
    """How a driver asked a simulated attempt to end."""

    NOW = "now"
    AFTER_CHECKPOINT = "checkpoint"


@dataclass
class SimAttempt:
    """Where one attempt stands; ``checkpoints`` maps each checkpoint it names to the
    ``(training_iteration, time_total_s)`` it holds (shared by the executor's attempts)."""

    spec: TrialSpec
    worker: str
    resources: dict[str, float]
    steps: Sequence[tuple[Any, ...]]
    pos: int  # index of the next step to run
    token: int  # clock entries with another token are stale
    checkpoints: dict[str, tuple[int, float]]
    iteration: int = 0
    time_total: float = 0.0
    since_restore: int = 0
    time_since_restore: float = 0.0
    ckpt_index: int = 0
    started: bool = False
    stop: str | None = None  # None or a StopRequest
    seq: int = 0
    duration: float = 0.0  # of the iteration in flight
    want_checkpoint: bool = False  # asked for by the driver (SHOULD_CHECKPOINT)

    def next_duration(self) -> float | None:
        """The model's duration of the next iteration, or None if none is left."""
        if self.pos >= len(self.steps):
            return None
        step = self.steps[self.pos]
        if not isinstance(step, tuple) or len(step) < 2 or not isinstance(step[1], dict):
            raise TypeError(f"trial_model step {self.pos} of {self.spec.trial_id} must be "
                            f"(duration_s, metrics dict[, checkpoint]), got {step!r}")
        d = float(step[0])
        if d < 0:
            raise ValueError(f"trial_model step {self.pos} of {self.spec.trial_id} has a "
                             f"negative duration {d!r}")
        return d

    def complete_iteration(self, now: float, host: str
                           ) -> tuple[EventKind, list[Report], str | None]:
        """The iteration in flight ended at virtual time ``now``: its reports, and whether
        the attempt goes on (REPORTS) or ended (FINISHED, ``error`` if it failed)."""
        spec = self.spec
        step = self.steps[self.pos]
        self.pos += 1
        duration = self.duration
        self.iteration += 1
        self.since_restore += 1
        self.time_total += duration
        self.time_since_restore += duration
        result = self._result(step[1], duration, now, host)
        wants = (bool(step[2]) if len(step) > 2 else False) or self.want_checkpoint
        self.want_checkpoint = False
        try:
            hit = stop_dict_hit(spec.stop, result)
        except ValueError as exc:  # the actor fails the trial, naming the key
            return EventKind.FINISHED, [], f"ValueError: {exc}"
        if hit:
            result["done"] = True
        last = hit or bool(result.get("done")) or self.pos >= len(self.steps)
        if checkpoint_due(spec, self.iteration, last):
            wants = True
        reports: list[Report] = []
        path = self._checkpoint() if wants else None
        if path is not None:
            result["checkpoint_dir_name"] = path.rsplit("/", 1)[-1]
        self.seq += 1
        reports.append(Report(self.seq, result, path))
        if self.stop == StopRequest.AFTER_CHECKPOINT and not last:
            if path is None:  # a checkpoint-only report, as the runner saves one
                self.seq += 1
                reports.append(Report(self.seq, None, self._checkpoint()))
            last = True
        return (EventKind.FINISHED if last else EventKind.REPORTS), reports, None

    def _checkpoint(self) -> str:
        path = f"{self.spec.trial_path}/{checkpoint_dir_name(self.ckpt_index)}"
        self.ckpt_index += 1
        self.checkpoints[path] = (self.iteration, self.time_total)
        return path

    def _result(self, metrics: dict[str, Any], duration: float, now: float,
                host: str) -> dict[str, Any]:
        spec = self.spec
        wall = EPOCH + now
        return fill_auto_fields(
            metrics,
            training_iteration=self.iteration,
            iterations_since_restore=self.since_restore,
            time_this_iter_s=duration,
            time_total_s=self.time_total,
            time_since_restore=self.time_since_restore,
            timestamp=wall,
            # Virtual time: UTC, so a simulation's dates do not depend on the machine's zone.
            date=format_date(wall, utc=True),
            trial_id=spec.trial_id,
            experiment_tag=spec.experiment_tag,
            pid=0,
            hostname=host,
            node_ip="127.0.0.1",
            worker=self.worker,
            config=spec.config,
        )
