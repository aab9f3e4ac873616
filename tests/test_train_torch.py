"""Trials that span several workers (``dasktune.train``): a ``TorchTrainer`` in a Tune
trial on real ``dask scheduler`` + ``dask worker`` processes, gloo on CPU.

Each rank appends a line per start (``ranks.jsonl``: rank, pid, the step it resumes
after) and per step it runs (``steps.jsonl``) to its trial's folder; the tests assert
against those records and against Tune's results, never after sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from typing import Any

import dask
import psutil
import pytest
from conftest import committed_manifests, pid_alive, read_jsonl, wait_for

import dasktune as tune
from dasktune import train
from dasktune.integration.ray_train import TuneReportCallback
from dasktune.train.torch import TorchTrainer, prepare_data_loader, prepare_model

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:  # one short O_APPEND write: lines never interleave
        f.write(json.dumps(record) + "\n")


def worker_pid() -> int:
    """The ``dask worker`` process hosting this rank: the rank's parent, or the parent of
    the worker's fork server that forked it."""
    import psutil

    parent = psutil.Process(os.getppid())
    if "dasktune.train.forkserver:serve" in parent.cmdline():
        return parent.ppid()
    return parent.pid


def malloc_trims() -> dict[str, str | None]:
    """``MALLOC_TRIM_THRESHOLD_`` in this rank's environment, its parent's (whose malloc a
    forked rank inherits) and its worker's (which Dask's nanny sets)."""
    import psutil

    key = "MALLOC_TRIM_THRESHOLD_"
    return {"rank": os.environ.get(key),
            "parent": psutil.Process(os.getppid()).environ().get(key),
            "worker": psutil.Process(worker_pid()).environ().get(key)}


def _commits(trial_dir: str) -> list[tuple[float, int]]:
    """(commit time, step) of each committed checkpoint of the trial."""
    return sorted((m["committed_at"], int(m["result"]["step"]))
                  for m in committed_manifests(trial_dir))


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
            {"rank": rank, "pid": os.getpid(), "worker_pid": worker_pid(),
             "parent_pid": os.getppid(), "t": time.time(), "malloc_trim": malloc_trims(),
             "start": start, "world": world,
             "local_rank": ctx.get_local_rank(), "env_rank": int(os.environ["RANK"]),
             "env_world": int(os.environ["WORLD_SIZE"])})
    for step in range(start + 1, config["steps"] + 1):
        _append(os.path.join(trial_dir, "steps.jsonl"), {"rank": rank, "step": step})
        if config.get("sleep"):
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
        tune.with_resources(driver, train.ScalingConfig(num_workers=2)),
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
        # Forked by their workers' fork servers (the default on Linux), not the workers.
        assert all(r["parent_pid"] != r["worker_pid"] for r in ranks)
        # Dask's malloc tuning for its workers (20% per step in a torch loop) stays with
        # the workers: neither the fork servers nor the ranks have it.
        assert all(r["malloc_trim"] == {"rank": None, "parent": None, "worker": "65536"}
                   for r in ranks)


def test_with_the_fork_server_off_each_rank_is_a_fresh_child_of_its_worker(
        dask_processes, connect, tmp_path):
    procs = dask_processes(n_workers=2, nthreads=1, resources="CPU=1",
                           env={"DASK_DASKTUNE__TRAIN__FORKSERVER": "False"})
    connect(procs.address)
    result = TorchTrainer(
        loop, train_loop_config={"steps": 2, "k": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results"))).fit()
    assert result.error is None and result.metrics["sum"] == 3.0
    ranks = read_jsonl(os.path.join(result.path, "ranks.jsonl"))
    worker_pids = {p.pid for p in procs.workers}
    assert len(ranks) == 2
    assert all(r["parent_pid"] == r["worker_pid"] and
               psutil.Process(r["worker_pid"]).ppid() in worker_pids for r in ranks)
    assert all(r["malloc_trim"]["rank"] is None and r["malloc_trim"]["worker"] == "65536"
               for r in ranks)


def rank0_checkpoint_loop(config: dict[str, Any]) -> None:
    """Rank 0 checkpoints every step; the other rank only reports (Ray's usual shape).
    A collective each step, as DDP's gradients: no rank runs ahead of the others."""
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    for step in range(1, config["steps"] + 1):
        dist.barrier()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                with open(os.path.join(tmp, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = train.Checkpoint.from_directory(tmp)
            train.report({"step": step}, checkpoint=checkpoint)


def test_a_checkpoint_does_not_wait_out_the_other_ranks_report_batches(
        dask_processes, connect, tmp_path):
    # Rank 1's reports may wait 90 s in its batch: each of rank 0's checkpoints (a
    # barrier over both ranks' reports) would wait that long, unless the controller asks
    # rank 1 to send its reports at once.
    procs = dask_processes(n_workers=2, nthreads=1, resources="CPU=1",
                           env={"DASK_DASKTUNE__TRAIN__REPORT_INTERVAL": "90s"})
    connect(procs.address)
    started = time.monotonic()
    result = TorchTrainer(
        rank0_checkpoint_loop, train_loop_config={"steps": 5},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results"))).fit()
    assert time.monotonic() - started < 90
    assert result.error is None
    assert list(result.metrics_dataframe["step"]) == [1, 2, 3, 4, 5]
    assert [step for _, step in _commits(result.path)] == [1, 2, 3, 4, 5]


def late_rank_loop(config: dict[str, Any]) -> None:
    """Rank 1 lingers after its last report: rank 0's process, then its launcher task,
    end seconds before rank 1 says done."""
    train.report({"step": 1})
    if train.get_context().get_world_rank() == 1:
        time.sleep(config["linger"])


def threads_loop() -> None:
    import torch

    train.report({"torch_threads": torch.get_num_threads(),
                  "omp": os.environ.get("OMP_NUM_THREADS")})


def test_a_rank_computes_on_as_many_threads_as_cpus_it_reserved(dask_processes, connect,
                                                                  tmp_path):
    # Dask's nanny gives its workers one math-library thread; a rank that reserved two
    # CPUs gets two, forked (CPU) or not (its server imported torch with one), as Ray
    # sets OMP_NUM_THREADS for a Train worker.
    procs = dask_processes(n_workers=2, nthreads=1, resources="CPU=2")
    client = connect(procs.address)
    for cpus, forkserver in ((2, True), (2, False), (1, True)):
        # On each worker, for its next ranks (dask.config.set itself: the workers cannot
        # import this module for a helper of its own).
        client.run(dask.config.set, {"dasktune.train.forkserver": forkserver})
        result = TorchTrainer(
            threads_loop, scaling_config=train.ScalingConfig(
                num_workers=2, resources_per_worker={"CPU": cpus}),
            run_config=train.RunConfig(storage_path=str(tmp_path / f"r{cpus}{forkserver}"))
        ).fit()
        assert result.error is None
        assert (result.metrics["torch_threads"], result.metrics["omp"]) == (cpus, str(cpus))


def test_a_rank_that_ends_first_leaves_the_group_running(dask_processes, connect, tmp_path):
    procs = dask_processes(n_workers=2, nthreads=1, resources="CPU=1")
    connect(procs.address)
    result = TorchTrainer(
        late_rank_loop, train_loop_config={"linger": 3},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results"))).fit()
    assert result.error is None and result.metrics["step"] == 1


# ------------------------------------------------------------------------------ chaos
def test_sigkill_of_a_rank_worker_restarts_the_group_from_the_newest_checkpoint(
        dask_processes, connect, tmp_path):
    procs = dask_processes(n_workers=0)
    for _ in range(4):
        procs.add_worker("--no-nanny", resources="CPU=1")  # the worker's pid is the process's
    procs.wait_workers(4)
    connect(procs.address)
    steps, k = 14, 3
    out: dict[str, Any] = {}
    tuner = tune.Tuner(
        tune.with_resources(driver, train.ScalingConfig(num_workers=2)),
        param_space={"steps": steps, "k": k, "sleep": 0.25},
        run_config=tune.RunConfig(name="chaos", storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread = threading.Thread(target=lambda: out.setdefault("grid", tuner.fit()), daemon=True)
    thread.start()
    exp = tmp_path / "results" / "chaos"

    def trial_dir() -> str | None:
        dirs = [d for d in exp.glob("*") if d.is_dir()] if exp.exists() else []
        return str(dirs[0]) if dirs else None

    def past_a_checkpoint() -> Any:
        d = trial_dir()
        done = [r["step"] for r in read_jsonl(os.path.join(d, "steps.jsonl"))] if d else []
        return d if done and max(done) >= k + 2 else None

    d = wait_for(past_a_checkpoint, timeout=240, what="the group past its first checkpoint")
    first = read_jsonl(os.path.join(d, "ranks.jsonl"))
    rank1 = next(r for r in first if r["rank"] == 1)
    victim = next(p for p in procs.workers if p.pid == rank1["worker_pid"])
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    thread.join(300)
    assert not thread.is_alive(), "the trial did not finish"
    grid = out["grid"]
    assert not grid.errors, grid.errors
    assert grid[0].metrics["step"] == steps

    starts = read_jsonl(os.path.join(d, "ranks.jsonl"))
    assert len(starts) == 4, starts  # both ranks started twice: together, once each
    before, after = starts[:2], starts[2:]
    assert {r["rank"] for r in before} == {r["rank"] for r in after} == {0, 1}
    assert {r["start"] for r in before} == {0}
    restart = after[0]["start"]
    assert {r["start"] for r in after} == {restart}
    # The restart took the newest checkpoint committed before it (the group commits
    # nothing once a rank is gone, so at most the one in flight at the kill).
    committed = [step for t, step in _commits(d) if t < min(r["t"] for r in after)]
    assert restart == max(committed) and restart >= k
    assert restart >= max(step for t, step in _commits(d) if t < killed_at)
    # No step lost, none repeated beyond the checkpoint.
    for rank in (0, 1):
        ran = [r["step"] for r in read_jsonl(os.path.join(d, "steps.jsonl"))
               if r["rank"] == rank]
        # The second run starts where the step count goes back (or, if the first run
        # ended right at the checkpoint, right after it).
        cut = next((i for i in range(1, len(ran)) if ran[i] <= ran[i - 1]), restart)
        first_run, second_run = ran[:cut], ran[cut:]
        assert first_run == list(range(1, len(first_run) + 1))
        assert second_run == list(range(restart + 1, steps + 1))
    reported = list(grid[0].metrics_dataframe["step"])
    assert reported[-(steps - restart):] == list(range(restart + 1, steps + 1))
    # No rank process left anywhere.
    # Every rank process, and the killed worker's fork server, are gone.
    pids = [r["pid"] for r in starts] + [rank1["parent_pid"]]
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30,
             what=f"every rank process and the lost worker's fork server to exit ({pids})")


# ------------------------------------------------------------------ outside Tune, DDP
def ddp_loop(config: dict[str, Any]) -> None:
    """A tiny DDP model trained one epoch: each rank sees its own half of the data."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    model = prepare_model(torch.nn.Linear(2, 1))
    data = TensorDataset(torch.arange(16.0).reshape(8, 2), torch.ones(8, 1))
    loader = prepare_data_loader(DataLoader(data, batch_size=2, shuffle=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for x, y in loader:
        seen.extend(int(v) for v in x[:, 0].tolist())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (sorted(seen), float(sum(p.sum() for p in model.parameters()))))
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(model.state_dict(), os.path.join(tmp, f"model{dist.get_rank()}.pt"))
        train.report({"wrapped": type(model).__name__, "seen": [s for s, _ in everyone],
                      "params": [p for _, p in everyone]},
                     checkpoint=train.Checkpoint.from_directory(tmp))


def test_fit_outside_tune_trains_a_ddp_model(cluster, tmp_path):
    result = TorchTrainer(
        ddp_loop, scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="standalone", storage_path=str(tmp_path / "results")),
    ).fit()
    assert result.error is None
    m = result.metrics
    assert m["wrapped"] == "DistributedDataParallel"
    halves = m["seen"]
    assert len(halves[0]) == len(halves[1]) == 4
    assert sorted(halves[0] + halves[1]) == list(range(0, 16, 2))  # each sample once
    assert m["params"][0] == pytest.approx(m["params"][1])  # DDP kept the replicas equal
    assert result.path.startswith(str(tmp_path / "results" / "standalone"))
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model1.pt"))
        assert set(state) == {"module.weight", "module.bias"}


def test_fit_outside_tune_keeps_the_checkpoints_its_checkpoint_config_says(cluster, tmp_path):
    result = TorchTrainer(
        loop, train_loop_config={"steps": 4, "k": 1},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path / "results"),
                                   checkpoint_config=train.CheckpointConfig(num_to_keep=2)),
    ).fit()
    assert result.error is None
    # The same retention as any trial's: the two newest of four, each with both ranks'
    # files.
    assert [step for _, step in _commits(result.path)] == [3, 4]
    with result.checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "rank1.json")))["step"] == 4


def failing_loop(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    ctx = train.get_context()
    _append(os.path.join(ctx.get_trial_dir(), "ranks.jsonl"), {"rank": ctx.get_world_rank()})
    dist.barrier()  # both ranks are on record before rank 1 fails
    if ctx.get_world_rank() == 1:
        raise ValueError("rank 1 cannot go on")
    train.report({"step": 1})


def test_a_rank_error_retries_the_group_then_fails_fit(cluster, tmp_path):
    trainer = TorchTrainer(
        failing_loop, scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="failing", storage_path=str(tmp_path / "results"),
                                   failure_config=train.FailureConfig(max_failures=1)))
    with pytest.raises(train.TrainingFailedError, match="rank 1 cannot go on"):
        trainer.fit()
    (trial,) = [d for d in (tmp_path / "results" / "failing").glob("*") if d.is_dir()]
    starts = read_jsonl(str(trial / "ranks.jsonl"))
    assert sorted(r["rank"] for r in starts) == [0, 0, 1, 1]  # one restart, both ranks


# ------------------------------------------------------------------ graceful retirement
def notice_loop(config: dict[str, Any]) -> None:
    """Counts to ``steps`` with no checkpoint of its own: only when a preemption notice
    comes does it checkpoint (at its next report), as a spot-aware loop would."""
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, f"rank{rank}.json")) as f:
            start = json.load(f)["step"]
    trial_dir = ctx.get_trial_dir()
    _append(os.path.join(trial_dir, "ranks.jsonl"), {"rank": rank, "start": start,
                                                     "pid": os.getpid(),
                                                     "worker_pid": worker_pid()})
    noticed = False
    for step in range(start + 1, config["steps"] + 1):
        _append(os.path.join(trial_dir, "steps.jsonl"), {"rank": rank, "step": step})
        time.sleep(config["sleep"])
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if noticed:
                with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = train.Checkpoint.from_directory(tmp)
                _append(os.path.join(trial_dir, "notices.jsonl"), {"rank": rank, "step": step})
            train.report({"step": step}, checkpoint=checkpoint)
        noticed = train.get_preemption_info() is not None and checkpoint is None


def notice_driver(config: dict[str, Any]) -> None:
    TorchTrainer(notice_loop, train_loop_config=config,
                 scaling_config=train.ScalingConfig(num_workers=2),
                 run_config=train.RunConfig(callbacks=[TuneReportCallback()])).fit()


def start_notice_trial(tmp_path: Any, name: str, steps: int
                       ) -> tuple[threading.Thread, dict[str, Any], Any]:
    """A ``steps``-step ``notice_driver`` trial fitting in a thread: (the thread, where its
    ``ResultGrid`` lands under ``"grid"``, its trial folder once the group ran step 3)."""
    out: dict[str, Any] = {}
    tuner = tune.Tuner(
        tune.with_resources(notice_driver, train.ScalingConfig(num_workers=2)),
        param_space={"steps": steps, "sleep": 0.3},
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread = threading.Thread(target=lambda: out.setdefault("grid", tuner.fit()), daemon=True)
    thread.start()
    exp = tmp_path / "results" / name

    def running_at_step_3() -> Any:
        dirs = [d for d in exp.glob("*") if d.is_dir()] if exp.exists() else []
        if not dirs:
            return None
        ran = [r["step"] for r in read_jsonl(str(dirs[0] / "steps.jsonl"))]
        return dirs[0] if ran and max(ran) >= 3 else None

    return thread, out, wait_for(running_at_step_3, timeout=240, what="the group at step 3")


def test_retiring_head_worker_gives_a_notice_and_the_trial_resumes_from_its_checkpoint(
        dask_processes, connect, tmp_path):
    from distributed import Client

    procs = dask_processes(n_workers=4, nthreads=1, resources="CPU=1")
    connect(procs.address)
    steps = 12
    thread, out, d = start_notice_trial(tmp_path, "notice", steps)
    head = read_jsonl(str(d / "result.json"))[-1]["worker"]  # where the driver function runs
    with Client(procs.address, set_as_default=False, timeout="20s") as client:
        client.retire_workers([head], close_workers=True, remove=True)
    thread.join(300)
    assert not thread.is_alive(), "the trial did not finish"
    grid = out["grid"]
    assert not grid.errors, grid.errors  # max_failures=0: a retirement is no failure
    assert grid[0].metrics["step"] == steps
    notices = read_jsonl(str(d / "notices.jsonl"))
    assert sorted(n["rank"] for n in notices) == [0, 1]  # both ranks checkpointed on notice
    noticed_at = notices[0]["step"]
    starts = read_jsonl(str(d / "ranks.jsonl"))
    assert [r["start"] for r in starts[2:]] == [noticed_at, noticed_at]  # nothing lost


@pytest.mark.parametrize("how", ["retire_workers", "sigterm"])
def test_retiring_a_rank_worker_checkpoints_first_and_restarts_the_group_on_a_fresh_gang(
        dask_processes, connect, tmp_path, how):
    """Rank 1's worker (not the head's) retires: ``client.retire_workers``, or SIGTERM to
    its ``dask worker`` (the nanny closes the worker)."""
    from distributed import Client

    procs = dask_processes(n_workers=4, nthreads=1, resources="CPU=1")
    connect(procs.address)
    steps = 12
    thread, out, d = start_notice_trial(tmp_path, "rank-retire", steps)
    rank1 = next(r for r in read_jsonl(str(d / "ranks.jsonl")) if r["rank"] == 1)
    with Client(procs.address, set_as_default=False, timeout="20s") as client:
        victim = next(addr for addr, pid in client.run(os.getpid).items()
                      if pid == rank1["worker_pid"])
        assert victim != read_jsonl(str(d / "result.json"))[-1]["worker"]  # not the head
        if how == "sigterm":
            with open(f"/proc/{rank1['worker_pid']}/stat") as f:
                nanny = int(f.read().rsplit(")", 1)[1].split()[1])  # the worker's parent
            os.kill(next(p for p in procs.workers if p.pid == nanny).pid, signal.SIGTERM)
        else:
            client.retire_workers([victim], close_workers=True, remove=True)
        thread.join(300)
        assert not thread.is_alive(), "the trial did not finish"
        # Retired once the group had left it.
        wait_for(lambda: victim not in client.scheduler_info(n_workers=-1)["workers"],
                 timeout=60, what=f"{victim} to retire")
    grid = out["grid"]
    assert not grid.errors, grid.errors  # max_failures=0: a retirement is no failure
    assert [r["step"] for r in read_jsonl(str(d / "result.json"))] == \
        list(range(1, steps + 1))  # each step reported exactly once
    notices = read_jsonl(str(d / "notices.jsonl"))
    assert sorted(n["rank"] for n in notices) == [0, 1]  # both ranks checkpointed on notice
    noticed_at = notices[0]["step"]
    assert notices[1]["step"] == noticed_at
    starts = read_jsonl(str(d / "ranks.jsonl"))
    assert len(starts) == 4, starts  # one restart, both ranks
    assert [r["start"] for r in starts[2:]] == [noticed_at, noticed_at]  # nothing lost
    # The restarted rank 1 runs elsewhere: the retired worker took no new rank.
    assert all(r["worker_pid"] != rank1["worker_pid"] for r in starts[2:])
    for rank in (0, 1):
        ran = [r["step"] for r in read_jsonl(str(d / "steps.jsonl")) if r["rank"] == rank]
        assert ran[-(steps - noticed_at):] == list(range(noticed_at + 1, steps + 1))
    pids = [r["pid"] for r in starts]
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30,
             what=f"every rank process to exit ({pids})")


# ------------------------------------------------------------ without the callback; misuse
def quiet_driver(config: dict[str, Any]) -> None:
    """A 2-worker trainer without TuneReportCallback: as in Ray V2, nothing reaches Tune."""
    TorchTrainer(loop, train_loop_config=config,
                 scaling_config=train.ScalingConfig(num_workers=2)).fit()


def uneven_loop(config: dict[str, Any]) -> None:
    for step in range(3 if train.get_context().get_world_rank() == 0 else 2):
        train.report({"step": step})


def test_without_the_callback_checkpoints_commit_but_no_metrics_reach_tune(cluster, tmp_path):
    grid = tune.Tuner(
        tune.with_resources(quiet_driver, train.ScalingConfig(num_workers=2)),
        param_space={"steps": 2, "k": 2},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    result = grid[0]
    assert "step" not in result.metrics  # no result row came from the ranks
    ckpts = [n for n in os.listdir(result.path) if n.startswith("checkpoint_")]
    assert ckpts == ["checkpoint_000000"]  # the ranks' step-2 checkpoint, committed once
    with open(os.path.join(result.path, ckpts[0], "rank1.json")) as f:
        assert json.load(f) == {"step": 2}


def test_ranks_reporting_different_numbers_of_times_fail_clearly(cluster, tmp_path):
    trainer = TorchTrainer(
        uneven_loop, scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="uneven", storage_path=str(tmp_path / "results")))
    with pytest.raises(train.TrainingFailedError, match="same number of times"):
        trainer.fit()
