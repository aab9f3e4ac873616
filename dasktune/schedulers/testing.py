"""A deterministic simulated driver for scheduler tests: no Dask, no threads, a fake clock.

:class:`SimulatedRun` plays the controller's part of the contract: it asks
``choose_trial_to_run`` to fill free slots, advances every running trial one iteration per
round, feeds each result to the scheduler and carries out the decision (PAUSE checkpoints and
frees the slot, STOP terminates, :class:`~dasktune.schedulers.Exploit` restarts from the
donor's checkpoint with the new config, :class:`~dasktune.schedulers.Reconfigure` pauses with
the new config and resources), and terminates what ``trials_to_stop`` returns.
Any scheduler, including a user's own, can be exercised with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dasktune.layout import checkpoint_dir_name, checkpoint_index
from dasktune.schedulers._base import Exploit, Reconfigure, TrialScheduler
from dasktune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED, Trial

__all__ = ["SimpleContext", "SimulatedRun"]


class SimpleContext:
    """A :class:`~dasktune.schedulers.SchedulerContext` over a list of trials and a clock."""

    def __init__(self, trials: list[Trial] | None = None, clock: Callable[[], float] | None = None):
        self.trials: list[Trial] = list(trials or [])
        self._clock = clock or (lambda: 0.0)

    def get_trials(self) -> list[Trial]:
        """All trials the test added."""
        return self.trials

    def get_live_trials(self) -> list[Trial]:
        """The trials that have not finished."""
        return [t for t in self.trials if not t.is_finished]

    def time(self) -> float:
        """The test's clock, in seconds."""
        return self._clock()


@dataclass
class SimulatedRun:
    """Run ``trials`` under ``scheduler`` with ``slots`` concurrent slots.

    ``metrics(trial, iteration)`` returns the metrics a trial reports at ``iteration``
    (1-based; it sees the trial's current config, so PBT exploits change what it reports).
    A trial ends by itself after ``max_iterations[trial_id]`` (default ``max_iter``).
    ``training_iteration`` and ``time_total_s`` (``iteration * seconds_per_iter``) are added.
    Trials checkpoint every ``checkpoint_every`` iterations and whenever they are paused.
    ``use_trials_to_stop=False`` plays a driver that ignores :meth:`trials_to_stop`.
    """

    scheduler: TrialScheduler
    trials: list[Trial]
    metrics: Callable[[Trial, int], dict[str, Any]]
    slots: int = 1
    max_iter: int = 100
    max_iterations: dict[str, int] = field(default_factory=dict)
    seconds_per_iter: float = 1.0
    checkpoint_every: int = 1
    use_trials_to_stop: bool = True
    add_trials_upfront: bool = True
    clock: float = 0.0
    iterations_run: int = 0
    # ("start", id) / ("result", id, iteration, decision) / ("stopped", id) / ("end", id)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)  # last iteration each trial ran

    def __post_init__(self) -> None:
        self.ctx = SimpleContext([], clock=lambda: self.clock)
        if self.add_trials_upfront:
            for trial in self.trials:
                self.add(trial)

    def add(self, trial: Trial) -> None:
        """Announce one trial to the scheduler (as the driver does for a new suggestion)."""
        if trial not in self.ctx.trials:
            self.ctx.trials.append(trial)
        self.scheduler.on_trial_add(self.ctx, trial)

    # ---------------------------------------------------------------- loop
    def run(self, max_rounds: int = 10_000, until_end: bool = True) -> SimulatedRun:
        """Play rounds until nothing runs and nothing can be started.

        With ``until_end=False``, stop quietly after ``max_rounds`` (to save and restore
        mid-run); else running out of rounds is an error.
        """
        for _ in range(max_rounds):
            self._fill()
            running = [t for t in self.ctx.trials if t.status == RUNNING]
            if not running:
                if any(t.status in (PENDING, PAUSED) for t in self.ctx.trials):
                    raise AssertionError(
                        f"stuck: {[(t.trial_id, t.status) for t in self.ctx.trials]} but "
                        f"choose_trial_to_run returned None")
                return self
            for trial in running:
                if trial.status == RUNNING:  # an earlier decision this round may have ended it
                    self._step(trial)
            self.clock += self.seconds_per_iter
            if self.use_trials_to_stop:
                for trial in self.scheduler.trials_to_stop(self.ctx):
                    self._terminate(trial, trial.last_result, early=True)
        if until_end:
            raise AssertionError(f"no end after {max_rounds} rounds")
        return self

    def _fill(self) -> None:
        while sum(t.status == RUNNING for t in self.ctx.trials) < self.slots:
            trial = self.scheduler.choose_trial_to_run(self.ctx)
            if trial is None:
                return
            if trial.status not in (PENDING, PAUSED):
                raise AssertionError(f"choose_trial_to_run returned {trial!r}")
            restore = trial.restore_path or trial.checkpoint
            self.position[trial.trial_id] = _ckpt_iteration(restore)
            trial.restore_path = None
            trial.attempt += 1
            trial.set_status(RUNNING)
            self.events.append(("start", trial.trial_id))

    def _step(self, trial: Trial) -> None:
        tid = trial.trial_id
        it = self.position.get(tid, 0) + 1
        self.position[tid] = it
        self.iterations_run += 1
        result = dict(self.metrics(trial, it))
        result.update(training_iteration=it, time_total_s=it * self.seconds_per_iter,
                      trial_id=tid)
        if it % self.checkpoint_every == 0:
            trial.checkpoint = f"sim/{tid}/{checkpoint_dir_name(it)}"
        trial.update_last_result(result)
        decision = self.scheduler.on_trial_result(self.ctx, trial, result)
        self.events.append(("result", tid, it, decision))
        if it >= self.max_iterations.get(tid, self.max_iter):
            # The trainable returned: it ends whatever the scheduler said (as the driver does).
            self._terminate(trial, result, early=False)
            return
        if decision in (TrialScheduler.CONTINUE, TrialScheduler.NOOP, None):
            return
        if decision == TrialScheduler.PAUSE or isinstance(decision, Reconfigure):
            trial.checkpoint = f"sim/{tid}/{checkpoint_dir_name(it)}"
            trial.set_status(PAUSED)
            if isinstance(decision, Reconfigure):
                trial.config = dict(decision.config or trial.config)
                trial.resources = dict(decision.resources or trial.resources)
        elif decision == TrialScheduler.STOP:
            self._terminate(trial, result, early=True)
        elif isinstance(decision, Exploit):
            trial.config = dict(decision.config)
            trial.restore_path = decision.checkpoint
            trial.set_status(PENDING)
        else:
            raise AssertionError(f"unknown decision {decision!r} for {tid}")

    def _terminate(self, trial: Trial, result: dict[str, Any], early: bool) -> None:
        if trial.is_finished:
            return
        trial.set_status(TERMINATED)
        self.events.append(("stopped" if early else "end", trial.trial_id))
        self.scheduler.on_trial_complete(self.ctx, trial, dict(result or {}))

    def error(self, trial: Trial) -> None:
        """Mark a trial ERROR (as the driver does when its budget of failures is spent)."""
        trial.set_status(ERROR)
        self.scheduler.on_trial_error(self.ctx, trial)

    # ---------------------------------------------------------------- queries
    def decisions(self, trial_id: str) -> list[tuple[int, Any]]:
        """``(iteration, decision)`` for each result of one trial."""
        return [(e[2], e[3]) for e in self.events if e[0] == "result" and e[1] == trial_id]

    def stopped(self) -> list[str]:
        """Trials early-stopped, in order."""
        return [e[1] for e in self.events if e[0] == "stopped"]

    def starts(self) -> list[str]:
        """Trial ids in the order they were (re)started."""
        return [e[1] for e in self.events if e[0] == "start"]


def _ckpt_iteration(path: str | None) -> int:
    if not path:
        return 0
    index = checkpoint_index(path)
    if index is None:
        raise ValueError(f"not a checkpoint folder: {path!r}")
    return index
