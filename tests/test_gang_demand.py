"""An elastic cluster grows for a trial's whole gang (issue 23).

Real adaptive ``LocalCluster`` of single-thread worker processes, starting with none:
a trial whose gang needs two distinct worker processes must make Dask's ``Adaptive``
add two, whether the gang is declared up front (``ScalingConfig``: the controller waits
to start the trial) or asked for by a running trial (``reserve_workers``: the gang
queue waits). Each run is bounded by ``time_budget_s``, so a cluster that never grows
ends the experiment with the trials unfinished instead of hanging the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from test_faults_workers import join, run_in_thread

import dasktune as tune
from dasktune.train import ScalingConfig

pytestmark = pytest.mark.slow

BUDGET_S = 90.0


class MostWorkers(SchedulerPlugin):
    """Records on the scheduler the most workers the cluster ever had at once."""

    name = "dasktune-test-most-workers"

    def __init__(self) -> None:
        self.most = 0

    def add_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.most = max(self.most, len(scheduler.workers))


def gang_trial(config: dict[str, Any]) -> None:
    """Reserve two single-CPU workers and report their distinct processes."""
    from distributed import get_client

    from dasktune.session import reserve_workers

    gang = reserve_workers([{"CPU": 1}] * 2, timeout=BUDGET_S)
    pids = get_client().run(os.getpid, workers=gang.workers)
    tune.report({"ranks": len(set(pids.values()))})


@pytest.fixture
def adaptive() -> Iterator[MostWorkers]:
    """An adaptive LocalCluster (0 to 3 single-thread worker processes) as the default
    client, and its scheduler's worker count."""
    tune.shutdown()  # fit() must use this cluster, not an embedded one
    cluster = LocalCluster(n_workers=0, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address="127.0.0.1:0")
    cluster.adapt(minimum=0, maximum=3, interval="100ms")
    client = Client(cluster)
    most = MostWorkers()
    cluster.scheduler.add_plugin(most)  # the scheduler runs in this process
    try:
        yield most
    finally:
        client.close()
        cluster.close()


def _fit(tmp_path: Any, trainable: Any, samples: int) -> tune.ResultGrid:
    tuner = tune.Tuner(trainable, param_space={"x": 1},
                       tune_config=tune.TuneConfig(num_samples=samples,
                                                   time_budget_s=BUDGET_S),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="grow",
                                                 verbose=0))
    thread, box = run_in_thread(tuner.fit)
    return join(thread, box, BUDGET_S + 90)


def _all_ran(grid: tune.ResultGrid, samples: int) -> None:
    assert not grid.errors, grid.errors
    ranks = [r.metrics.get("ranks") for r in grid]
    assert ranks == [2] * samples, f"trials that never ran: {ranks}"


def test_declared_gangs_grow_the_cluster(adaptive, tmp_path):
    # Head {"CPU": 0} + two 1-CPU ranks: each trial needs two worker processes.
    grid = _fit(tmp_path, tune.with_resources(gang_trial, ScalingConfig(num_workers=2)), 2)
    _all_ran(grid, 2)
    assert adaptive.most >= 2


def test_a_running_trials_gang_request_grows_the_cluster(adaptive, tmp_path):
    # The trial's own slot (1 CPU, lent back while it waits) + two 1-CPU ranks.
    grid = _fit(tmp_path, gang_trial, 1)
    _all_ran(grid, 1)
    assert adaptive.most >= 2
