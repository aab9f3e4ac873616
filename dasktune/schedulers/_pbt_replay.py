"""PBT replay: train one trial with the config schedule a PBT run's policy log recorded."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

import fsspec

from dasktune.schedulers._base import Reconfigure
from dasktune.schedulers._fifo import FIFOScheduler

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["PopulationBasedTrainingReplay", "load_policy"]

logger = logging.getLogger(__name__)


def load_policy(lines: list[str], where: str) -> tuple[dict[str, Any] | None,
                                                       list[tuple[int, dict[str, Any]]]]:
    """``(initial config, [(iteration, new config), ...])`` from a policy file's lines.

    Each line is ``[trial tag, donor tag, trial iteration, donor iteration, donor config,
    new config]``. A trial's file holds its donors' histories before its own exploits, so
    the schedule is the chain read back from the last line: each step's donor is the
    trial of the step before; where that breaks, older lines were overwritten. The trial
    went on from its donor's iteration with the new config.
    """
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"could not read the PBT policy file {where}: line {n} is not "
                             f"JSON: {line[:80]!r}") from None
        if not isinstance(row, list) or len(row) != 6:
            raise ValueError(f"could not read the PBT policy file {where}: line {n} is not a "
                             f"[trial tag, donor tag, iteration, donor iteration, donor "
                             f"config, new config] list")
        rows.append(row)
    schedule: list[tuple[int, dict[str, Any]]] = []
    initial = None
    expected_trial = None
    for trial_tag, donor_tag, _step, donor_step, donor_config, new_config in reversed(rows):
        if expected_trial is not None and trial_tag != expected_trial:
            break
        expected_trial = donor_tag
        initial = donor_config
        schedule.append((int(donor_step), new_config))
    return initial, list(reversed(schedule))


class PopulationBasedTrainingReplay(FIFOScheduler):
    """Ray's ``PopulationBasedTrainingReplay``: replay a PBT run's schedule on one trial.

    PBT finds a schedule of configs rather than one config. This scheduler reads the
    ``pbt_policy_<trial_id>.txt`` that :class:`~dasktune.schedulers.PopulationBasedTraining`
    wrote (with ``log_config=True``, the default) in the experiment folder and trains one
    trial along it: the trial starts with the schedule's first config, and when it reports
    the ``training_iteration`` at which PBT changed the config, it is checkpointed and
    resumed with the next config (a :class:`~dasktune.schedulers.Reconfigure` decision).
    For the changes to land on the same iterations, the trial must checkpoint at them (the
    same ``checkpoint_frequency`` as the PBT run does it).

    ``policy_file``: a local path (``~`` expanded) or an fsspec URL.
    """

    _state_attrs = ("_trial_id", "_next", "_current_step", "_num_perturbations",
                    "current_config")

    def __init__(self, policy_file: str):
        super().__init__()
        path = str(policy_file)
        if "://" not in path:
            path = os.path.expanduser(path)
        try:
            with fsspec.open(path, "rt") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            raise ValueError(f"Policy file not found: {path}") from None
        self.policy_file = path
        self.config, self._policy = load_policy(lines, path)
        self.experiment_tag = f"replay_{os.path.basename(path)}"
        self.current_config = self.config
        self._trial_id: str | None = None
        self._next = 0  # index of the next change in self._policy
        self._current_step = 0
        self._num_perturbations = 0

    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        if self._trial_id is not None and trial.trial_id != self._trial_id:
            raise ValueError("More than one trial added to a PBT replay run: the same "
                             "schedule would be trained several times; set num_samples=1")
        self._trial_id = trial.trial_id
        if self._policy:
            if trial.config and trial.config != self.config:
                logger.warning("PopulationBasedTrainingReplay: the trial's config %s is "
                               "replaced by the policy's %s", trial.config, self.config)
            trial.config = dict(self.config or {})
        elif trial.config:
            self.config = self.current_config = dict(trial.config)
        else:
            raise ValueError(f"The PBT policy file {self.policy_file} has no schedule and "
                             f"the trial has no config: pass param_space to the Tuner, or "
                             f"do not use a PBT replay for this run")

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str | Reconfigure:
        if "training_iteration" not in result or self._next >= len(self._policy):
            return self.CONTINUE
        step = int(result["training_iteration"])
        self._current_step = step
        change_at, new_config = self._policy[self._next]
        if step < change_at:
            return self.CONTINUE
        logger.info("PopulationBasedTrainingReplay: at step %s the config becomes %s",
                    step, new_config)
        self._next += 1
        self._num_perturbations += 1
        self.current_config = new_config
        return Reconfigure(config=dict(new_config))

    @property
    def schedule(self) -> list[tuple[int, dict[str, Any]]]:
        """``[(iteration, config), ...]``: after that iteration, the trial has that config."""
        return list(self._policy)

    def debug_string(self) -> str:
        return (f"PopulationBasedTraining replay: Step {self._current_step}, perturb "
                f"{self._num_perturbations}")
