"""Multi-worker trials: dasktune's ``TorchTrainer`` against plain ``torch.multiprocessing``
+ gloo (and Ray 2.60's ``TorchTrainer`` in a Tune driver function, when ``ray`` is
installed), the same loop in the same run, on CPU.

(a) first report: seconds from ``fit()`` (or from spawning the processes) to rank 0's
    first report of a 2-worker run: the first run on the fresh cluster, and the best
    run (later dasktune runs fork their ranks from the workers' warm fork servers);
(b) per step: median seconds per step of a small DDP model (2 ranks, a report every
    ``--report-every`` steps, 1 by default; plain torch sends the same metrics to its
    parent through a queue).

Prints each figure and the ratios dasktune/plain and dasktune/Ray (lower is better), and
the CPU dasktune spends outside the ranks per step: on a host whose cores the ranks fill,
that CPU is what slows them.
The targets (issue 23): per-step overhead <= 5% over plain torch; first report >= 5x
sooner than Ray's.

Named ``multi_worker.py``, not ``distributed.py`` (issue 23's name): run as a script, a
file of that name in ``benchmarks/`` shadows the ``distributed`` package for every
benchmark beside it.

    python benchmarks/multi_worker.py               # 2 ranks, 200 steps
    python benchmarks/multi_worker.py --steps 50 --repeat 1
    python benchmarks/multi_worker.py --report-every 10   # a report per 10 steps
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

WIDTH, BATCH = 256, 64


def _model_loop(config: dict[str, Any], report: Any) -> None:
    """The measured loop: a small MLP under DDP, a report each ``every`` steps (rank 0's
    kept)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.manual_seed(dist.get_rank())
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
    every = config.get("every", 1)
    for step in range(config["steps"]):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if (step + 1) % every == 0:
            report({"step": step, "loss": loss.item(), "t": time.time()})


def _step_times(rows: list[dict[str, Any]], warmup: int, every: int) -> float:
    """Median seconds per step between consecutive reports, after ``warmup`` reports."""
    ts = [r["t"] for r in sorted(rows, key=lambda r: r["step"])][warmup:]
    return statistics.median(b - a for a, b in zip(ts, ts[1:])) / every


# -------------------------------------------------------------------- plain torch
def _plain_rank(rank: int, world: int, port: int, config: dict[str, Any], queue: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _model_loop(config, (lambda m: queue.put(m)) if rank == 0 else (lambda m: None))
    dist.barrier()  # no rank tears gloo down under another (it may abort the process)
    dist.destroy_process_group()


def run_plain(world: int, steps: int, every: int) -> tuple[float, list[dict[str, Any]]]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t0 = time.time()
    config = {"steps": steps, "every": every}
    procs = mp.start_processes(_plain_rank, args=(world, port, config, queue),
                               nprocs=world, join=False, start_method="spawn")
    rows = [queue.get() for _ in range(steps // every)]
    procs.join()
    return rows[0]["t"] - t0, rows


# ----------------------------------------------------------------------- dasktune
def _dasktune_loop(config: dict[str, Any]) -> None:
    from dasktune import train

    _model_loop(config, train.report)


def _outside_ranks() -> list[Any]:
    """This process (the driver and the scheduler) and its other live children (Dask's
    nannies and workers): all but the fork servers and the ranks they fork."""
    import psutil

    out = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            if not any("dasktune.train.forkserver:serve" in p.cmdline()
                       for p in [proc, *proc.parents()]):
                out.append(proc)
        except psutil.Error:  # gone, or a zombie (a plain torch rank not yet reaped)
            continue
    return out


def _cpu_seconds(procs: list[Any]) -> float:
    total = 0.0
    for proc in procs:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def run_dasktune(world: int, steps: int, every: int, storage: str
                 ) -> tuple[float, list[dict[str, Any]], float | None]:
    """The first report's delay, the reports, and the CPU seconds per step spent outside
    the ranks (the driver, the scheduler, the workers) while the steps run (None for a
    run too short to tell)."""
    import threading

    from dasktune import train
    from dasktune.train.torch import TorchTrainer

    procs = _outside_ranks()  # they outlive the fit
    samples: list[tuple[float, float]] = []
    fitting = threading.Event()

    def sample() -> None:  # a few /proc reads a time: no CPU worth counting
        while not fitting.wait(0.2):
            samples.append((time.time(), _cpu_seconds(procs)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.time()
    try:
        result = TorchTrainer(
            _dasktune_loop, train_loop_config={"steps": steps, "every": every},
            scaling_config=train.ScalingConfig(num_workers=world),
            run_config=train.RunConfig(storage_path=storage, verbose=0)).fit()
    finally:
        fitting.set()
        sampler.join()
    rows = result.metrics_dataframe.to_dict("records")
    times = sorted(r["t"] for r in rows)
    # The samples taken while the ranks stepped (past the first reports, before the end).
    inside = [(t, cpu) for t, cpu in samples if times[0] + 0.5 < t < times[-1]]
    cpu = None
    if len(inside) >= 2:
        (ta, a), (tb, b) = inside[0], inside[-1]
        stepped = every * sum(ta <= t < tb for t in times)
        cpu = (b - a) / max(stepped, 1)
    return times[0] - t0, rows, cpu


# ---------------------------------------------------------------------------- ray
def _ray_driver(config: dict[str, Any]) -> None:
    from ray import train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    TorchTrainer(lambda c: _model_loop(c, train.report), train_loop_config=config,
                 scaling_config=train.ScalingConfig(num_workers=config["world"]),
                 run_config=train.RunConfig(callbacks=[TuneReportCallback()])).fit()


def run_ray(world: int, steps: int, every: int, storage: str
            ) -> tuple[float, list[dict[str, Any]]]:
    from ray import tune

    t0 = time.time()
    grid = tune.Tuner(_ray_driver,
                      param_space={"steps": steps, "every": every, "world": world},
                      run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
    rows = grid[0].metrics_dataframe.to_dict("records")
    return min(r["t"] for r in rows) - t0, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, best kept")
    parser.add_argument("--report-every", type=int, default=1, metavar="K",
                        help="a report each K steps (default: every step)")
    args = parser.parse_args()
    every = args.report_every
    if every < 1 or args.steps // every < 8:
        parser.error("--report-every must be >= 1 and leave at least 8 reports")
    warmup = min(10, args.steps // every // 4)
    try:
        import ray  # noqa: F401
        has_ray = True
    except ImportError:
        has_ray = False
    import dasktune

    # One slot per worker process, as many processes as ranks (the head takes no CPU).
    dasktune.init(num_cpus=args.workers, dashboard_address="127.0.0.1:0")
    figures: dict[str, list[tuple[float, float]]] = {"plain": [], "dasktune": [], "ray": []}
    cpus: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):  # alternating, so load drifts hit both alike
            first, rows = run_plain(args.workers, args.steps, every)
            figures["plain"].append((first, _step_times(rows, warmup, every)))
            first, rows, cpu = run_dasktune(args.workers, args.steps, every,
                                            os.path.join(tmp, "dt"))
            figures["dasktune"].append((first, _step_times(rows, warmup, every)))
            if cpu is not None:
                cpus.append(cpu)
        dasktune.shutdown()
        if has_ray:
            import ray

            ray.init(num_cpus=args.workers + 1, include_dashboard=False,
                     log_to_driver=False)
            for _ in range(args.repeat):
                first, rows = run_ray(args.workers, args.steps, every,
                                      os.path.join(tmp, "ray"))
                figures["ray"].append((first, _step_times(rows, warmup, every)))
            ray.shutdown()
    # The first run of each on its fresh cluster apart: dasktune's first trainer on a
    # worker starts the worker's fork server, later ones fork from it warm.
    best = {k: (v[0][0], min(f for f, _ in v), min(s for _, s in v))
            for k, v in figures.items() if v}
    print(f"{args.workers} ranks, {args.steps} steps, a report each {every}, "
          f"MLP {WIDTH}x{WIDTH}, batch {BATCH}, gloo on CPU; best of {args.repeat}")
    print(f"{'':10} {'first report: 1st run (s)':>26} {'best (s)':>9} {'per step (ms)':>14}")
    for name, (cold, first, step) in best.items():
        print(f"{name:10} {cold:26.2f} {first:9.2f} {step * 1e3:14.2f}")
    if cpus:
        print(f"dasktune's CPU outside the ranks (driver, scheduler, workers) while the "
              f"ranks step: {statistics.median(cpus) * 1e3:.3f} ms per step (median of "
              f"{len(cpus)})")
    for ref in ("plain", "ray"):
        if ref not in best:
            print(f"{ref}: not installed, not measured")
            continue
        d, r = best["dasktune"], best[ref]
        print(f"dasktune/{ref + ':':6} first report {d[0] / r[0]:.2f}x (1st run), "
              f"{d[1] / r[1]:.2f}x (best); per step {d[2] / r[2]:.3f}x")
    if args.repeat > 1:
        # Each dasktune run against the plain run just before it: the spread says how
        # much of a best-of ratio is the machine's noise.
        ratios = sorted(d[1] / p[1] for p, d in zip(figures["plain"], figures["dasktune"]))
        print(f"dasktune/plain per step, run by run: {statistics.median(ratios):.3f}x median "
              f"({', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
