"""Past this machine: 1,000 simulated workers, up to 100,000 trials, the real driver loop.

The driver's CPU time per trial should stay constant as the trial count grows. Two
shapes: ``aligned`` (every trial takes the same time, so 1,000 finish at once and the
driver sees few, large batches) and ``jittered`` (every event at its own time: one driver
pass per event, the worst case for per-pass costs that grow with the trial count).

    python benchmarks/scale/simulate.py            # 1k/10k/100k aligned, 1k/3k/10k jittered
    python benchmarks/scale/simulate.py --quick    # 1k/10k aligned, 1k/3k jittered
    python benchmarks/scale/simulate.py --profile 10000 --jitter 0.5
    python benchmarks/scale/simulate.py --gc-off   # without Python's cyclic GC

What grows with the trial count is CPython's cyclic garbage collector: its full
collections walk every live container, and the driver keeps each finished trial (about
19 tracked objects: its config, last result, metric windows, placement). ``--gc-off``
runs the same with the collector off, to show the driver's own work per trial apart.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import LazySteps, emit  # noqa: E402

import dasktune as tune  # noqa: E402
from dasktune.config import TuneConfig  # noqa: E402
from dasktune.schedulers import ASHAScheduler  # noqa: E402
from dasktune.simulator import SimulatedExecutor, run_simulated  # noqa: E402


def one(n_trials: int, workers: int, iters: int, jitter: float, scheduler: str) -> dict:
    ex = SimulatedExecutor(workers, trial_model=lambda c, t: LazySteps(iters, 10.0),
                           seed=0, jitter=jitter)
    sched = None
    if scheduler == "asha":
        sched = ASHAScheduler(time_attr="training_iteration", max_t=iters, grace_period=1)
    tc = TuneConfig(metric="loss", mode="min", num_samples=n_trials, seed=0, scheduler=sched)
    cpu, wall = time.process_time(), time.perf_counter()
    results = run_simulated("sim", {"x": tune.uniform(0, 1)}, tc, executor=ex)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert len(results) == n_trials
    return {"trials": n_trials, "workers": workers, "jitter": jitter, "scheduler": scheduler,
            "gc": gc.isenabled(),
            "reports": ex.num_reports, "virtual_s": round(ex.now, 1), "cpu_s": cpu,
            "wall_s": wall, "cpu_ms_per_trial": 1000 * cpu / n_trials,
            "cpu_us_per_report": 1e6 * cpu / max(ex.num_reports, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--scheduler", choices=("fifo", "asha"), default="fifo")
    ap.add_argument("--profile", type=int, default=0, help="profile one run of N trials")
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--sizes", help="aligned trial counts, e.g. 1000,10000,20000 (no jittered)")
    ap.add_argument("--gc-off", action="store_true", help="turn Python's cyclic GC off")
    args = ap.parse_args()
    if args.gc_off:
        gc.disable()
    if args.profile:
        from pyinstrument import Profiler

        prof = Profiler()
        prof.start()
        emit(one(args.profile, args.workers, args.iters, args.jitter, args.scheduler))
        prof.stop()
        print(prof.output_text(unicode=False), file=sys.stderr)
        return
    aligned: tuple[int, ...] = (1000, 10000) if args.quick else (1000, 10000, 100000)
    jittered: tuple[int, ...] = (1000, 3000) if args.quick else (1000, 3000, 10000)
    if args.sizes:
        aligned, jittered = tuple(int(x) for x in args.sizes.split(",")), ()
    for n in aligned:
        emit(one(n, args.workers, args.iters, 0.0, args.scheduler))
    for n in jittered:
        emit(one(n, args.workers, args.iters, 0.5, args.scheduler))


if __name__ == "__main__":
    main()
