"""Bookkeeping overhead: N trials of d seconds on W=2 slots of the embedded cluster.

The floor is N*d/W (perfect packing, zero overhead); the ratio wall/floor is the figure
(target <= 1.05). Each trial sleeps ``d`` and reports once; loggers (JSON, CSV,
TensorBoard) are on, as a user would have them. ``--profile`` runs the driver under
pyinstrument and prints where the driver's time goes.

    python benchmarks/scale/overhead.py                 # 2,000 x 0.1 s and 10,000 x 0.02 s
    python benchmarks/scale/overhead.py --quick         # 200 x 0.1 s and 1,000 x 0.02 s
    python benchmarks/scale/overhead.py --quick --profile
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import emit, no_loggers  # noqa: E402

import dasktune as tune  # noqa: E402

SLOTS = 2


def sleeper(config):
    time.sleep(config["d"])
    tune.report({"loss": config["x"]})


def one(n: int, d: float, profile: bool, loggers: bool) -> dict:
    floor = n * d / SLOTS
    with tempfile.TemporaryDirectory() as tmp:
        rc = tune.RunConfig(name="overhead", storage_path=tmp, verbose=0,
                            callbacks=None if loggers else no_loggers())
        tc = tune.TuneConfig(num_samples=n, metric="loss", mode="min")
        tuner = tune.Tuner(sleeper, param_space={"x": tune.uniform(0, 1), "d": d},
                           tune_config=tc, run_config=rc)
        prof = None
        if profile:
            from pyinstrument import Profiler

            prof = Profiler(interval=0.005)
            prof.start()
        cpu, wall = time.process_time(), time.perf_counter()
        results = tuner.fit()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if prof is not None:
            prof.stop()
            print(prof.output_text(unicode=False, show_all=False), file=sys.stderr)
        assert results.num_terminated == n, results
    return {"trials": n, "d_s": d, "loggers": loggers, "floor_s": floor, "wall_s": wall,
            "ratio": wall / floor, "overhead_ms_per_trial": 1000 * (wall - floor) * SLOTS / n,
            "driver_cpu_s": cpu, "driver_cpu_ms_per_trial": 1000 * cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-loggers", action="store_true")
    ap.add_argument("--case", help="one case N,d instead (e.g. 400,0.05)")
    args = ap.parse_args()
    cases = [(200, 0.1), (1000, 0.02)] if args.quick else [(2000, 0.1), (10000, 0.02)]
    if args.case:
        n, d = args.case.split(",")
        cases = [(int(n), float(d))]
    tune.init(num_cpus=SLOTS)
    try:
        one(20, 0.01, False, True)  # warm the workers (imports, first actors)
        for n, d in cases:
            emit(one(n, d, args.profile, not args.no_loggers))
    finally:
        tune.shutdown()


if __name__ == "__main__":
    main()
