"""Run an experiment on simulated workers: :func:`run_simulated`, as ``Tuner.fit`` would.

The executor itself, :class:`~dasktune.execution.simulated.SimulatedExecutor`, lives
with the other executors; this module wires it to the real driver loop (the facade's
side, as :mod:`dasktune.tuner` is for a Dask cluster) and re-exports it, so that
``from dasktune.simulator import SimulatedExecutor, run_simulated`` keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dask.config

from dasktune import tuner_build
from dasktune.config import RunConfig, TuneConfig
from dasktune.driver import ExperimentPlan, TuneController
from dasktune.execution.simulated import SimulatedExecutor, TrialModel
from dasktune.experiment import StateWriter
from dasktune.logger import DEFAULT_LOGGERS
from dasktune.policy_log import PBTPolicyLogger
from dasktune.resources import normalize_request
from dasktune.results import ResultGrid
from dasktune.space import validate_param_space
from dasktune.stopper import make_stopper
from dasktune.storage import ExperimentStorage
from dasktune.trainable import Trainable

if TYPE_CHECKING:
    from dasktune.callback import Callback

__all__ = ["SimulatedExecutor", "TrialModel", "run_simulated"]


class _SimulatedTrainable(Trainable):
    """Stands in for the user's trainable (the simulated executor never runs it): a
    class, since a simulated trial checkpoints whenever asked, as a class trainable does."""

    def setup(self, config: dict[str, Any]) -> None:
        raise RuntimeError("a simulated trial does not run its trainable")


def run_simulated(trainable_name: str, param_space: Mapping[str, Any],
                  tune_config: TuneConfig | None = None, run_config: RunConfig | None = None,
                  executor: SimulatedExecutor | None = None, *,
                  resources: Mapping[str, float] | None = None, loggers: bool = False,
                  save_state: bool = False) -> ResultGrid:
    """Run an experiment on ``executor`` with the real driver loop, as ``Tuner.fit`` would.

    Args:
        trainable_name: names the trial folders (``<name>_<trial>``).
        param_space, tune_config, run_config: as for :class:`dasktune.Tuner`. Storage
            defaults to ``memory://dasktune-sim`` (nothing is written unless loggers are on).
        executor: the :class:`SimulatedExecutor` to run on.
        resources: each trial's request (Ray spelling, default ``{"cpu": 1}``).
        loggers: add the default JSON/CSV/TensorBoard loggers (off: measure the driver).
        save_state: write the experiment state periodically, as a real run does.
    """
    if not isinstance(executor, SimulatedExecutor):
        raise TypeError(f"run_simulated: executor must be a SimulatedExecutor, got "
                        f"{type(executor).__name__}")
    if not isinstance(trainable_name, str) or not trainable_name:
        raise ValueError(f"run_simulated: trainable_name must be a non-empty string, got "
                         f"{trainable_name!r}")
    validate_param_space(param_space)
    tc = tune_config or TuneConfig()
    rc = run_config or RunConfig()
    if not isinstance(tc, TuneConfig):
        raise TypeError(f"tune_config must be a dasktune.TuneConfig, got {type(tc).__name__}")
    if not isinstance(rc, RunConfig):
        raise TypeError(f"run_config must be a dasktune.RunConfig, got {type(rc).__name__}")
    name = rc.name or f"{trainable_name}_sim_{executor.seed}"
    storage = ExperimentStorage(rc.storage_path or "memory://dasktune-sim", name,
                                filesystem=rc.storage_filesystem,
                                storage_options=rc.storage_options)
    uid = f"{executor.seed & 0xFFFFFFFF:08x}"  # trial ids follow the seed: reproducible
    space = dict(param_space)
    search_alg = tuner_build.make_search_alg(tc, space, uid)
    scheduler = tuner_build.make_scheduler(tc)
    stopper, stop_dict = make_stopper(rc.stop)
    callbacks: list[Callback] = list(rc.callbacks or [])
    callbacks.append(PBTPolicyLogger())  # PBT's log_config lines (memory:// by default)
    if loggers:
        for cls in DEFAULT_LOGGERS:
            if not any(isinstance(cb, cls) for cb in callbacks):
                callbacks.append(cls())
    request = normalize_request(dict(resources) if resources is not None else None)
    writer = None
    if save_state:
        writer = StateWriter(storage, name=name, uid=uid, trainable_name=trainable_name,
                             tune_config=tc, run_config=rc, param_space=space)
        writer.write_static()
    reporter = tuner_build.make_reporter(rc, tc) if rc.verbose or rc.progress_reporter \
        else None
    plan = ExperimentPlan(
        trainable=_SimulatedTrainable,
        trainable_name=trainable_name,
        storage=storage,
        tune_config=tc,
        failure_config=rc.failure_config,  # type: ignore[arg-type]
        checkpoint_config=rc.checkpoint_config,  # type: ignore[arg-type]
        stopper=stopper,
        stop_dict=stop_dict,
        resources_for=lambda config: dict(request),
        # As before the plan existed: names from the creators only with a state writer.
        name_trial=(lambda trial: tuner_build.apply_name_creators(trial, tc)) if save_state
        else None,
    )
    controller = TuneController(plan, search_alg, scheduler, executor, callbacks,
                                save_state=writer, reporter=reporter)
    # Simulated time does not pass while a searcher thinks: ask on the loop's thread, so
    # that a run is the same for the same seed however slow the sampler is here.
    with dask.config.set({"dasktune.search.async-after": False}):
        controller.run()
    cc = rc.checkpoint_config
    return ResultGrid(controller.trials, storage, metric=tc.metric, mode=tc.mode,
                      score_attr=cc.checkpoint_score_attribute if cc else None,
                      score_order=cc.checkpoint_score_order if cc else "max")
