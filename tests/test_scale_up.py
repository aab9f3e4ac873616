"""Scale-up demand (issue 6): waiting trials are visible to Dask's ``Adaptive``.

Real ``LocalCluster``s with worker processes. An adaptive cluster that starts with no
workers only grows if the scheduler sees work; dasktune shows it one placeholder task
(``dasktune-demand-<trial_id>-<n>``) per trial that waits for resources.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

import dasktune as tune
from dasktune.execution.dask_executor import DaskExecutor

pytestmark = pytest.mark.slow

PREFIX = "dasktune-demand-"


class DemandWatch(SchedulerPlugin):
    """Records, on the scheduler, the demand tasks that ever existed and the most that
    ever existed at once for one trial."""

    name = "dasktune-test-demand-watch"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.seen: set[str] = set()
        self.most_per_trial = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if not str(key).startswith(PREFIX):
            return
        self.seen.add(str(key))
        per_trial: dict[str, int] = {}
        for k in self.live():
            trial = k[len(PREFIX):].rsplit("-", 1)[0]
            per_trial[trial] = per_trial.get(trial, 0) + 1
        self.most_per_trial = max([self.most_per_trial, *per_trial.values()])

    def live(self) -> list[str]:
        return [str(k) for k in self.scheduler.tasks if str(k).startswith(PREFIX)]


def train(config: dict[str, Any]) -> None:
    tune.report({"x": config["x"]})


def fit(storage: str, name: str) -> tune.ResultGrid:
    return tune.Tuner(
        train, param_space={"x": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()


@pytest.fixture
def cluster() -> Iterator[Any]:
    """Factory: a LocalCluster of single-thread worker processes, with a DemandWatch."""
    made: list[tuple[LocalCluster, Client]] = []

    def make(n_workers: int, adapt: bool) -> tuple[LocalCluster, Client, DemandWatch]:
        tune.shutdown()  # fit() must use this cluster, not an embedded one
        c = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address="127.0.0.1:0")
        if adapt:
            c.adapt(minimum=0, maximum=2, interval="100ms")
        client = Client(c)  # the default client: fit() runs on it
        made.append((c, client))
        watch = DemandWatch(c.scheduler)
        c.scheduler.add_plugin(watch)  # the scheduler runs in this process
        return c, client, watch

    yield make
    for c, client in made:
        client.close()
        c.close()


def test_adaptive_cluster_grows_for_waiting_trials(cluster, tmp_path):
    _, _, watch = cluster(0, adapt=True)
    results = fit(str(tmp_path), "grow")
    assert not results.errors, results.errors
    assert sorted(r.metrics["x"] for r in results) == [1, 2]
    assert all(r.metrics["worker"] for r in results)
    # The trials waited (there were no workers), each with one placeholder at a time...
    assert watch.seen and watch.most_per_trial == 1
    # ...and none is left once fit() returns.
    wait_for(lambda: not watch.live(), timeout=10, what="demand tasks to be released")


def test_fixed_cluster_gets_no_demand(cluster, tmp_path):
    # One 1-CPU worker, two 1-CPU trials: the second waits, but nothing can scale.
    _, _, watch = cluster(1, adapt=False)
    results = fit(str(tmp_path), "fixed")
    assert not results.errors, results.errors
    assert len({r.metrics["worker"] for r in results}) == 1
    assert not watch.seen


def test_demand_is_one_task_per_trial_until_withdrawn(cluster):
    c, client, watch = cluster(0, adapt=False)
    executor = DaskExecutor(client)
    executor.demand("t1", {"CPU": 1.0, "GPU": 1.0})
    executor.demand("t1", {"CPU": 1.0, "GPU": 1.0})  # again: still one
    executor.demand("t2", {"CPU": 1.0})
    wait_for(lambda: len(watch.live()) == 2, what="two demand tasks")
    assert sorted(k.rsplit("-", 1)[0] for k in watch.live()) == [PREFIX + "t1", PREFIX + "t2"]
    task = c.scheduler.tasks[next(k for k in watch.live() if k.startswith(PREFIX + "t1"))]
    assert task.resource_restrictions == {"CPU": 1.0, "GPU": 1.0}
    # What Adaptive asks the scheduler: workers are wanted now.
    assert c.scheduler.adaptive_target() >= 1
    executor.withdraw("t1")
    executor.withdraw("t1")
    wait_for(lambda: [k.rsplit("-", 1)[0] for k in watch.live()] == [PREFIX + "t2"],
             what="t1's demand to go")
    executor.shutdown()  # withdraws the rest
    wait_for(lambda: not watch.live(), what="t2's demand to go")
    assert c.scheduler.adaptive_target() == 0
    assert watch.most_per_trial == 1
