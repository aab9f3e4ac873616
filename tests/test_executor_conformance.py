"""Both executors keep the :class:`~dasktune.execution.Executor` contract
(:func:`dasktune.execution.testing.check_executor`): the Dask executor on the embedded
cluster's real worker processes, the simulated one on its virtual clock."""

from __future__ import annotations

import time

import cloudpickle

import dasktune as tune
from dasktune.execution.dask_executor import DaskExecutor
from dasktune.execution.simulated import SimulatedExecutor
from dasktune.execution.testing import check_executor
from dasktune.session import TrialSpec
from dasktune.storage import ExperimentStorage


def _spec_factory(storage: ExperimentStorage, trainable: object):
    def make_spec(trial_id: str, n: int) -> TrialSpec:
        return TrialSpec(trial_id=trial_id, trial_name=trial_id,
                         experiment_name=storage.name, config={"n": n},
                         trainable=trainable, storage=storage,
                         trial_path=storage.trial_path(trial_id))
    return make_spec


def test_the_dask_executor_keeps_the_contract(local_client, tmp_path):
    def counting(config):  # defined here: the workers cannot import this test module
        for i in range(config["n"]):
            tune.report({"i": i})
            if config["n"] > 3:
                time.sleep(0.01)  # long trials: a stop lands while they run

    storage = ExperimentStorage(str(tmp_path / "results"), "conformance")
    executor = DaskExecutor(local_client)
    executor.watch_cluster()
    check_executor(executor, _spec_factory(storage, cloudpickle.dumps(counting)))


def test_the_simulated_executor_keeps_the_contract():
    storage = ExperimentStorage("memory://conformance-sim", "conformance")
    executor = SimulatedExecutor(
        2, trial_model=lambda config, trial_id: [(1.0, {"i": i}) for i in range(config["n"])])
    check_executor(executor, _spec_factory(storage, None))
