"""An elastic cluster grows for a trial's whole gang (issue 23).

Real adaptive ``LocalCluster`` of single-thread worker processes, starting with none:
a trial whose gang needs two distinct worker processes must make Dask's ``Adaptive``
add two, whether the gang is declared up front (``ScalingConfig``: the controller waits
to start the trial) or asked for by a running trial (``reserve_workers``: the gang
queue waits). Each run is bounded by ``time_budget_s``, so a cluster that never grows
ends the experiment with the trials unfinished instead of hanging the test. Then, on an
in-process scheduler: what ``adaptive_target`` answers as gangs wait and stop waiting,
and the walltime and gang additions counted together.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from test_faults_workers import join, run_in_thread

import dasktune as tune
from dasktune.cluster.walltime import ENDING_TOPIC, WalltimeTargetPlugin
from dasktune.execution import gang_demand
from dasktune.execution.dask_executor import DaskExecutor
from dasktune.train import ScalingConfig

BUDGET_S = 90.0


class MostWorkers(SchedulerPlugin):
    """Records on the scheduler the most workers the cluster ever had at once."""

    name = "dasktune-test-most-workers"

    def __init__(self) -> None:
        self.most = 0

    def add_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.most = max(self.most, len(scheduler.workers))


def gang_trial(config: dict[str, Any]) -> None:
    """Reserve two single-CPU workers; report their distinct processes, and whether the
    scheduler would pick one of them for scale-down while the gang is held."""
    import time

    from distributed import get_client

    from dasktune.session import reserve_workers

    gang = reserve_workers([{"CPU": 1}] * 2, timeout=BUDGET_S)
    client = get_client()
    pids = client.run(os.getpid, workers=gang.workers)
    closable = client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.workers_to_close()))
    time.sleep(1.0)  # ten adapt intervals: an idle-looking worker would be retired
    alive = client.scheduler_info(n_workers=-1)["workers"]
    tune.report({"ranks": len(set(pids.values())),
                 "closable": len(set(gang.workers) & set(closable)),
                 "kept": all(w in alive for w in gang.workers)})


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
    # Held gangs' workers are never picked for scale-down (their GangSlot actors).
    assert [(r.metrics["closable"], r.metrics["kept"]) for r in grid] == [(0, True)] * samples


@pytest.mark.slow
def test_declared_gangs_grow_the_cluster(adaptive, tmp_path):
    # Head {"CPU": 0} + two 1-CPU ranks: each trial needs two worker processes.
    grid = _fit(tmp_path, tune.with_resources(gang_trial, ScalingConfig(num_workers=2)), 2)
    _all_ran(grid, 2)
    assert adaptive.most >= 2


@pytest.mark.slow
def test_a_running_trials_gang_request_grows_the_cluster(adaptive, tmp_path):
    # The trial's own slot (1 CPU, lent back while it waits) + two 1-CPU ranks.
    grid = _fit(tmp_path, gang_trial, 1)
    _all_ran(grid, 1)
    assert adaptive.most >= 2


def ddp_loop(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from dasktune import train

    total = torch.tensor([float(train.get_context().get_world_rank() + 1)])
    dist.all_reduce(total)  # 1 + 2 on two ranks
    train.report({"sum": total.item()})


def torch_driver(config: dict[str, Any]) -> None:
    """A Tune trainable that runs a 2-worker TorchTrainer (gloo) and reports to its trial."""
    from dasktune import train
    from dasktune.integration.ray_train import TuneReportCallback
    from dasktune.train.torch import TorchTrainer

    TorchTrainer(ddp_loop, scaling_config=ScalingConfig(num_workers=2),
                 run_config=train.RunConfig(callbacks=[TuneReportCallback()])).fit()


@pytest.mark.slow
def test_a_torch_trainer_trial_grows_the_cluster(adaptive, tmp_path):
    pytest.importorskip("torch")
    grid = _fit(tmp_path, tune.with_resources(torch_driver, ScalingConfig(num_workers=2)), 1)
    assert not grid.errors, grid.errors
    assert [r.metrics.get("sum") for r in grid] == [3.0]
    assert adaptive.most >= 2


# ---------------------------------------------------------------- in-process scheduler
@pytest.fixture
def in_process() -> Iterator[tuple[Any, Client]]:
    """A LocalCluster with its scheduler and one single-thread worker in this process."""
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                           dashboard_address="127.0.0.1:0")
    client = Client(cluster, set_as_default=False)
    try:
        yield cluster.scheduler, client
    finally:
        client.close()
        cluster.close()


def _target(client: Client) -> int:
    """What Dask's ``Adaptive`` is told (it calls this handler over the comm)."""
    return int(client.sync(client.scheduler.adaptive_target))


def test_a_waiting_gang_adds_the_workers_it_lacks_until_withdrawn(in_process):
    scheduler, client = in_process
    worker, = scheduler.workers
    executor = DaskExecutor(client)
    assert executor.watch_cluster()  # installs the plugins, the gang demand's among them
    plugin = scheduler.plugins[gang_demand.PLUGIN_NAME]
    assert _target(client) == 0  # one idle worker: Dask would close it
    # Head {"CPU": 0} + two 1-CPU ranks, one worker of one thread: one more worker.
    executor.demand("g1", {"CPU": 0.0}, [{"CPU": 1.0}] * 2, "PACK")
    executor.demand("g1", {"CPU": 0.0}, [{"CPU": 1.0}] * 2, "PACK")  # again: the same
    wait_for(lambda: plugin.workers_wanted() == 1, what="the gang's demand")
    # The worker the gang counts on is kept, and one more is wanted.
    assert scheduler.workers_to_close() == []
    assert _target(client) == 2
    # A second gang, of three ranks: three more (none of them the first gang's).
    executor.demand("g2", {"CPU": 0.0}, [{"CPU": 1.0}] * 3, "PACK")
    wait_for(lambda: _target(client) == 1 + 1 + 2, what="both gangs' demand")
    executor.withdraw("g1")
    executor.withdraw("g1")
    wait_for(lambda: _target(client) == 1 + 2, what="g1's demand to go")
    executor.shutdown()  # withdraws the rest
    wait_for(lambda: _target(client) == 0, what="g2's demand to go")
    assert scheduler.workers_to_close() == [worker]


def test_a_gang_that_fits_now_or_a_plain_trial_adds_no_gang_demand(in_process):
    scheduler, client = in_process
    executor = DaskExecutor(client)
    executor.watch_cluster()
    plugin = scheduler.plugins[gang_demand.PLUGIN_NAME]
    executor.demand("fits", {"CPU": 0.0}, [{"CPU": 1.0}], "PACK")  # one rank: it fits
    executor.demand("plain", {"CPU": 1.0})  # a placeholder task, as before
    executor.demand("late", {"CPU": 0.0}, [{"CPU": 1.0}] * 2, "PACK")  # the probe
    # Only the probe's lacking worker (a gang that fits now sends nothing at all).
    wait_for(lambda: plugin.workers_wanted() == 1, what="the probe's demand")
    executor.shutdown()


def test_a_driver_gone_without_withdrawing_leaves_no_demand(in_process):
    scheduler, client = in_process
    other = Client(scheduler.address, set_as_default=False)
    try:
        executor = DaskExecutor(other)
        executor.watch_cluster()
        executor.demand("g", {"CPU": 0.0}, [{"CPU": 1.0}] * 3, "SPREAD")
        wait_for(lambda: _target(client) >= 2, what="the gang's demand")
    finally:
        other.close()  # no shutdown(): the scheduler drops the client
    wait_for(lambda: _target(client) == 0, what="the demand of a client gone")


def test_messages_out_of_order_keep_the_newest(in_process):
    scheduler, _ = in_process
    plugin = gang_demand.GangDemandPlugin()
    plugin.scheduler = scheduler
    new = {"client": "c", "trial": "t", "workers": 0, "seq": 2}
    old = {"client": "c", "trial": "t", "workers": 5, "seq": 1, "known": []}
    plugin.log_event(gang_demand.TOPIC, new)
    plugin.log_event(gang_demand.TOPIC, old)  # overtaken on the way: ignored
    plugin.log_event("another-topic", {**old, "seq": 3})
    assert plugin.workers_wanted() == 0


@pytest.mark.parametrize("first", ["walltime", "gangs"])
def test_walltime_and_gang_additions_count_together(in_process, first):
    """Each plugin chains on the handler it finds, whichever is installed first."""
    scheduler, client = in_process
    worker, = scheduler.workers
    plugins = [WalltimeTargetPlugin(), gang_demand.GangDemandPlugin()]
    for plugin in plugins if first == "walltime" else plugins[::-1]:
        client.register_plugin(plugin)
    # The worker's batch job ends soon: one replacement (the worker is idle, so Dask
    # itself would close it: 0 + 1)...
    client.sync(client.scheduler.log_event, topic=ENDING_TOPIC, msg={"worker": worker})
    wait_for(lambda: _target(client) == 1, what="the walltime replacement")
    # ...and a gang that counts on that worker and lacks two more: 1 kept + 2 + 1.
    client.sync(client.scheduler.log_event, topic=gang_demand.TOPIC,
                msg={"client": client.id, "trial": "t", "seq": 1, "workers": 2,
                     "keep": [worker], "known": [worker]})
    wait_for(lambda: _target(client) == 4, what="both additions")
