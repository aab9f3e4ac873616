"""Trials that span several workers (``dasktune.train``): a ``TorchTrainer`` in a Tune
trial on real ``dask scheduler`` + ``dask worker`` processes, gloo on CPU.

Each rank appends a line per start (``ranks.jsonl``: rank, pid, the step it resumes
after) and per step it runs (``steps.jsonl``) to its trial's folder; the tests assert
against those records and against Tune's results, never after sleeps.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest

import dasktune as tune
from dasktune import train
from dasktune.integration.ray_train import TuneReportCallback
from dasktune.train.torch import TorchTrainer

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:  # one short O_APPEND write: lines never interleave
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f.read().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def loop(config: dict[str, Any]) -> None:
    """Counts to ``steps``; a checkpoint every ``k`` steps with one file per rank."""
    import torch.distributed as dist

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # 1 + 2 on two ranks
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, f"rank{rank}.json")) as f:
            start = json.load(f)["step"]
    trial_dir = ctx.get_trial_dir()
    _append(os.path.join(trial_dir, "ranks.jsonl"),
            {"rank": rank, "pid": os.getpid(), "start": start, "world": world,
             "local_rank": ctx.get_local_rank(), "env_rank": int(os.environ["RANK"]),
             "env_world": int(os.environ["WORLD_SIZE"])})
    for step in range(start + 1, config["steps"] + 1):
        _append(os.path.join(trial_dir, "steps.jsonl"), {"rank": rank, "step": step})
        if config.get("sleep"):
            import time

            time.sleep(config["sleep"])
        checkpoint = None
        with tempfile.TemporaryDirectory() as tmp:
            if step % config["k"] == 0:
                with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = train.Checkpoint.from_directory(tmp)
            train.report({"step": step, "sum": total.item(), "rank": rank, "world": world},
                         checkpoint=checkpoint)


def driver(config: dict[str, Any]) -> None:
    """The Tune trainable: a 2-worker TorchTrainer reporting to its trial."""
    trainer = TorchTrainer(
        loop, train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(callbacks=[TuneReportCallback()],
                                   failure_config=train.FailureConfig(max_failures=3)))
    trainer.fit()


@pytest.fixture
def cluster(dask_processes, connect) -> Any:
    """Four single-thread workers (one trial slot each), dasktune connected."""
    procs = dask_processes(n_workers=4, nthreads=1, resources="CPU=1")
    connect(procs.address)
    return procs


def test_two_two_worker_trials_report_all_reduce_and_checkpoint(cluster, tmp_path):
    grid = tune.Tuner(
        driver,
        param_space={"steps": 4, "k": 2, "seed": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    for result in grid:
        m = result.metrics
        assert (m["step"], m["sum"], m["rank"], m["world"]) == (4, 3.0, 0, 2)
        assert m["training_iteration"] == 4
        rows = result.metrics_dataframe
        assert list(rows["step"]) == [1, 2, 3, 4]
        # One checkpoint with both ranks' files, committed once per checkpointed report.
        with result.checkpoint.as_directory() as d:
            assert sorted(n for n in os.listdir(d) if not n.startswith(".")) == \
                ["rank0.json", "rank1.json"]
            assert json.load(open(os.path.join(d, "rank1.json")))["step"] == 4
        ranks = read_jsonl(os.path.join(result.path, "ranks.jsonl"))
        assert sorted((r["rank"], r["world"], r["env_rank"], r["env_world"]) for r in ranks) \
            == [(0, 2, 0, 2), (1, 2, 1, 2)]
