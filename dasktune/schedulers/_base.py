"""The scheduler contract: :class:`TrialScheduler`, its context and its decisions.

A scheduler is a pure decider (Ray's ``ray.tune.schedulers.TrialScheduler``). It sees trials
and results through a read-only :class:`SchedulerContext` and answers with a decision; the
driver loop (:mod:`dasktune.driver`) carries decisions out. It never touches Dask, the
driver or storage.

Decisions returned by :meth:`TrialScheduler.on_trial_result` are values of a small type: a
:class:`Decision` (Ray's ``TrialScheduler.CONTINUE`` ... constants are its members, and
equal to Ray's strings, so a scheduler written for Ray works unchanged) or an
:class:`Exploit`:

- ``CONTINUE`` / ``NOOP``: keep running.
- ``PAUSE``: the driver checkpoints and stops the trial, marks it PAUSED and frees its slot;
  it resumes from that checkpoint when :meth:`~TrialScheduler.choose_trial_to_run` returns it.
- ``STOP``: the trial is early-stopped (TERMINATED).
- :class:`Exploit` (PBT): restart the trial with a new config from a donor's checkpoint;
  its ``policy`` (PBT's ``log_config`` line) is written by a callback, not the scheduler.
- :class:`Reconfigure`: pause the trial as for ``PAUSE`` and give it a new config and/or
  new resources, which its next start (from that checkpoint) runs with (PBT replay,
  resource changing).

Bookkeeping is keyed by ``trial_id``, never by Trial object: a restored experiment rebuilds its
trials from JSON, and :meth:`~TrialScheduler.set_state` must still find them. One thread calls
every hook; schedulers are not thread safe.
"""

from __future__ import annotations

import copy
import enum
import math
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dasktune.metric_mode import check_mode, merge_search_properties
from dasktune.result import reported_keys
from dasktune.trial import PAUSED, PENDING

if TYPE_CHECKING:
    from dasktune.trial import Trial

__all__ = [
    "Decision", "Exploit", "PolicyLine", "Reconfigure", "SchedulerContext", "TrialScheduler",
]


class Decision(str, enum.Enum):
    """What a scheduler decides for a trial after a result (besides an :class:`Exploit`).

    A ``str`` enum: ``Decision.STOP == "STOP"``, so schedulers that return Ray's strings
    (or compare with them) keep working; the driver turns those into members.
    """

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"
    NOOP = "NOOP"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@runtime_checkable
class SchedulerContext(Protocol):
    """What a scheduler may see of the experiment (read-only by convention)."""

    def get_trials(self) -> list[Trial]:
        """All trials, in the order they were added."""
        ...

    def get_live_trials(self) -> list[Trial]:
        """Trials that are not TERMINATED or ERROR."""
        ...

    def time(self) -> float:
        """The experiment's clock in seconds (a fake one in simulations)."""
        ...


@dataclass(frozen=True)
class PolicyLine:
    """One line of PBT's policy log (``log_config``), for a callback to append to
    ``pbt_global.txt`` and to the trial's ``pbt_policy_<trial_id>.txt`` (which first takes
    over the donor's history: the trial now continues the donor's)."""

    trial_id: str
    donor_trial_id: str
    line: str  # JSON, ending in a newline


@dataclass
class Exploit:
    """PBT decision: restart the trial with ``config`` from the donor's ``checkpoint``."""

    config: dict[str, Any]
    checkpoint: str
    donor_trial_id: str
    policy: PolicyLine | None = None


@dataclass
class Reconfigure:
    """Pause the trial (checkpoint, stop, PAUSED) and resume it with these changes.

    ``config``: the trial's new config (None: unchanged). ``resources``: its new request as
    Dask resource tags, e.g. ``{"CPU": 4.0}`` (None: unchanged); the driver places it again
    with them, and the trial sees them in ``tune.get_context().get_trial_resources()``.
    """

    config: dict[str, Any] | None = None
    resources: dict[str, float] | None = None


def result_value(result: dict[str, Any], key: str, trial: Trial, where: str) -> Any:
    """``result[key]``, or a ValueError naming the key, the trial and the reported keys."""
    try:
        return result[key]
    except KeyError:
        raise ValueError(
            f"{where}: trial {trial.trial_id} reported a result without {key!r} "
            f"({reported_keys(result)})"
        ) from None


class TrialScheduler:
    """Decides, from results, whether trials continue, pause, stop or exploit.

    Every hook is a documented no-op here; subclasses override what they need. The first
    argument of each hook, ``tune_controller``, is a :class:`SchedulerContext` (Ray's name
    kept so Ray schedulers port unchanged).

    State: subclasses list their run-time bookkeeping attribute names in ``_state_attrs``;
    :meth:`get_state` deep-copies those (plus metric and mode) and :meth:`set_state` puts
    them back on a freshly built scheduler. Constructor arguments are not state: a restored
    experiment builds the scheduler from its ``TuneConfig`` again.
    """

    CONTINUE = Decision.CONTINUE
    PAUSE = Decision.PAUSE
    STOP = Decision.STOP
    NOOP = Decision.NOOP

    _state_attrs: tuple[str, ...] = ()
    _supports_buffered_results = True
    #: False where trials' actors must not be reused (``TuneConfig(reuse_actors=True)``
    #: is then refused at ``Tuner()``): a resized trial needs a new placement.
    allows_reuse_actors: bool = True

    def __init__(self, metric: str | None = None, mode: str | None = None):
        check_mode(mode, type(self).__name__)
        if metric is not None and not isinstance(metric, str):
            raise TypeError(f"{type(self).__name__}: metric must be a str, got {metric!r}")
        self._metric = metric
        self._mode = mode

    # ------------------------------------------------------------------ metric
    @property
    def time_attr(self) -> str | None:
        """The result key that measures a trial's progress (where its rungs or
        perturbation points lie), or None for a scheduler without one (FIFO)."""
        return getattr(self, "_time_attr", None)

    @property
    def metric(self) -> str | None:
        """The metric this scheduler compares, or None until set."""
        return self._metric

    @property
    def mode(self) -> str | None:
        """``"min"`` or ``"max"``, or None until set."""
        return self._mode

    @property
    def _metric_op(self) -> float:
        """+1 to maximise, -1 to minimise: ``op * value`` is always "higher is better"."""
        return -1.0 if self._mode == "min" else 1.0

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take metric and mode from ``TuneConfig`` where this scheduler has none.

        Returns False, as Ray's schedulers do, when the scheduler already has a metric
        and ``metric`` is given too, or a mode and ``mode`` is given too, even the same
        one: they are set in one place (the driver then raises). ``spec`` carries extra
        keywords; unknown ones are ignored.
        """
        check_mode(mode, type(self).__name__)
        merged = merge_search_properties((self._metric, self._mode), (metric, mode),
                                         refuse_twice=True)
        if merged is None:
            return False
        self._metric, self._mode = merged
        return True

    def _require_metric(self, where: str = "") -> None:
        if self._metric is None or self._mode is None:
            raise ValueError(
                f"{type(self).__name__}{where} needs a metric and a mode: pass them to the "
                f"scheduler or to TuneConfig(metric=..., mode=...)"
            )

    # ------------------------------------------------------------------ hooks
    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        """A new trial was created (or a restored PENDING one re-announced)."""

    def on_trial_error(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        """The trial ended in ERROR."""

    def on_trial_result(
        self, tune_controller: SchedulerContext, trial: Trial, result: dict[str, Any]
    ) -> str | Exploit:
        """A RUNNING trial reported ``result``; return a decision."""
        return self.CONTINUE

    def on_trial_complete(
        self, tune_controller: SchedulerContext, trial: Trial, result: dict[str, Any]
    ) -> None:
        """The trial is TERMINATED (finished, stopped by a decision, or by a stopper)."""

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        """The trial was removed from the experiment."""

    def choose_trial_to_run(self, tune_controller: SchedulerContext) -> Trial | None:
        """Pick a PENDING or PAUSED trial to start in a free slot, or None.

        Default: the first PENDING trial, else the first PAUSED one.
        """
        trials = tune_controller.get_trials()
        for status in (PENDING, PAUSED):
            for trial in trials:
                if trial.status == status:
                    return trial
        return None

    def trials_to_stop(self, tune_controller: SchedulerContext) -> list[Trial]:
        """PAUSED/PENDING trials this scheduler has given up on, for the driver to terminate.

        Returned trials are forgotten here (each is returned once). A driver that does not
        call this still finishes: :meth:`choose_trial_to_run` falls back to resuming them, and
        their first result is answered with ``STOP``.
        """
        return []

    def debug_string(self) -> str:
        """One line about this scheduler's state, for progress output."""
        return f"Using {type(self).__name__}."

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """A picklable dict of run-time bookkeeping (see the class docstring)."""
        state = {name: copy.deepcopy(getattr(self, name)) for name in self._state_attrs}
        state["_metric"] = self._metric
        state["_mode"] = self._mode
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`get_state` of an earlier run."""
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.set_state needs a dict, got {state!r}")
        for name, value in state.items():
            if name in self._state_attrs or name in ("_metric", "_mode"):
                setattr(self, name, copy.deepcopy(value))

    def save(self, checkpoint_path: str) -> None:
        """Pickle :meth:`get_state` to a local file."""
        import cloudpickle  # custom functions (PBT explore) may be lambdas

        with open(checkpoint_path, "wb") as f:
            cloudpickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Load what :meth:`save` wrote."""
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))


def finite(value: Any) -> bool:
    """Whether ``value`` is a real number that is not NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(
        value)
