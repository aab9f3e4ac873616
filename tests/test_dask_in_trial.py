"""Dask inside a trial: ``get_client``, ``worker_client`` and ``dask.compute`` in a trial
reach the cluster it runs on (real ``dask scheduler`` + two single-thread ``dask worker``
processes)."""

from __future__ import annotations

from typing import Any

import pytest

import dasktune as tune

pytestmark = pytest.mark.slow

WAIT_S = 60  # every wait on a Dask future is bounded: a deadlock fails, never hangs


@pytest.fixture
def cluster(dask_processes, connect) -> Any:
    """Two workers with one thread (and one trial slot, CPU=1) each, dasktune connected."""
    procs = dask_processes(n_workers=2, nthreads=1, resources="CPU=1")
    connect(procs.address)
    return procs


def _fit(trainable: Any, tmp_path, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grid = tune.Tuner(
        trainable,
        param_space={"k": tune.grid_search(configs)},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    return sorted((r.metrics for r in grid), key=lambda m: m["k"])


def _array_sums(k: int) -> dict[str, Any]:
    """A ``dask.array`` reduction three ways, each on the cluster the trial runs on."""
    import dask
    import dask.array as da
    from distributed import get_client

    x = da.ones((1000, 1000), chunks=100)
    client = get_client()
    return {
        "k": k,
        "compute": float(x.sum().compute()),
        "client": float(client.compute(x.sum() * k).result(timeout=WAIT_S)),
        "dask_compute": float(dask.compute(x.mean())[0]),
        "scheduler": client.scheduler.address,
        # Only a distributed scheduler runs a task on a worker of this cluster.
        "task_worker": dask.delayed(_task_worker)().compute(),
    }


def _task_worker() -> str:
    from distributed import get_worker

    return get_worker().address


def _nested(n: int) -> int:
    """A task that itself submits a task and waits on it (Dask's own secede/rejoin)."""
    from distributed import worker_client

    with worker_client() as client:
        return client.submit(lambda v: v * v, n).result(timeout=WAIT_S)


def _worker_client_sum(k: int) -> dict[str, Any]:
    """Submit tasks through ``worker_client`` and wait on them: every task needs one of
    the two workers' single threads while both trials occupy the workers' one slot."""
    from distributed import worker_client

    with worker_client() as client:
        futures = client.map(_nested, range(8), key=[f"nested-{k}-{i}" for i in range(8)])
        total = sum(client.gather(futures))
    return {"k": k, "total": total}


def _check_sums(rows: list[dict[str, Any]], address: str) -> None:
    workers = set()
    for row in rows:
        assert row["compute"] == 1_000_000.0
        assert row["client"] == 1_000_000.0 * row["k"]
        assert row["dask_compute"] == 1.0
        assert row["scheduler"] == address
        workers.add(row["task_worker"])
    assert all(w.startswith("tcp://127.0.0.1:") for w in workers)


def test_two_function_trials_compute_dask_arrays_on_the_cluster(cluster, tmp_path):
    def trainable(config: dict[str, Any]) -> None:
        tune.report(_array_sums(config["k"]))

    rows = _fit(trainable, tmp_path, [2, 3])
    assert [r["k"] for r in rows] == [2, 3]
    _check_sums(rows, cluster.address)


def test_worker_client_in_trials_on_busy_single_thread_workers(cluster, tmp_path):
    def trainable(config: dict[str, Any]) -> None:
        tune.report(_worker_client_sum(config["k"]))

    rows = _fit(trainable, tmp_path, [0, 1])
    assert [r["total"] for r in rows] == [sum(i * i for i in range(8))] * 2


class DaskStepper(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.k = config["k"]

    def step(self) -> dict[str, Any]:
        return {**_array_sums(self.k), **_worker_client_sum(self.k), "done": True}


def test_class_trainable_uses_dask_in_step(cluster, tmp_path):
    rows = _fit(DaskStepper, tmp_path, [2, 5])
    _check_sums(rows, cluster.address)
    assert [r["total"] for r in rows] == [sum(i * i for i in range(8))] * 2


def test_xgboost_dask_train_in_a_trial(cluster, tmp_path):
    pytest.importorskip("xgboost.dask")

    def trainable(config: dict[str, Any]) -> None:
        import dask.array as da
        import xgboost.dask
        from distributed import get_client

        client = get_client()
        rng = da.random.RandomState(0)
        X = rng.random_sample((2000, 5), chunks=500)
        y = (X[:, 0] + 2 * X[:, 1] > 1.5).astype("float64")
        dtrain = xgboost.dask.DaskDMatrix(client, X, y)
        out = xgboost.dask.train(
            client,
            {"objective": "binary:logistic", "eval_metric": "logloss",
             "max_depth": config["k"], "nthread": 1},
            dtrain, num_boost_round=10, evals=[(dtrain, "train")],
        )
        tune.report({"k": config["k"],
                     "train_logloss": out["history"]["train"]["logloss"][-1]})

    rows = _fit(trainable, tmp_path, [3])
    # Ten rounds on a separable rule: well below a coin flip's log loss (0.69).
    assert 0 < rows[0]["train_logloss"] < 0.4


def test_isolated_trial_process_reaches_the_cluster(cluster, tmp_path):
    """A trial in its own process (GPU trials, or ``dasktune.executor.isolate``): its
    default client is the cluster's, though it is no Dask worker."""
    import os

    import dask.config

    def trainable(config: dict[str, Any]) -> None:
        from distributed import get_worker

        try:
            get_worker()
            in_worker = True
        except ValueError:
            in_worker = False
        tune.report({**_array_sums(config["k"]), "pid": os.getpid(), "in_worker": in_worker})

    with dask.config.set({"dasktune.executor.isolate": True}):
        rows = _fit(trainable, tmp_path, [4])
    _check_sums(rows, cluster.address)
    with cluster.client() as client:
        worker_pids = set(client.run(os.getpid).values())
    assert rows[0]["pid"] not in worker_pids  # it did run in a child process
    assert rows[0]["in_worker"] is False
