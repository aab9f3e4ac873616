"""Bookkeeping overhead: N trials of d seconds on W=2 slots of the embedded cluster.

The floor is N*d/W (perfect packing, zero overhead); the ratio wall/floor is the figure
(target <= 1.05). Each trial sleeps ``d`` and reports once; loggers (JSON, CSV,
TensorBoard) are on, as a user would have them. ``--profile`` runs the driver under
pyinstrument and prints where the driver's time goes.

References, measured in the same run on the same machine: plain Dask (the same N sleeps
of d as ``client.map`` tasks on the same two single-thread workers: what the cluster
itself costs per task), and with ``--ray`` Ray Tune (the same trainable through
``from ray import tune`` on ``ray.init(num_cpus=2)``, ``reuse_actors=True``, in a
subprocess). Each row prints dasktune's ratio over the reference's.

    python benchmarks/scale/overhead.py                 # 2,000 x 0.1 s and 10,000 x 0.02 s
    python benchmarks/scale/overhead.py --quick         # 200 x 0.1 s and 1,000 x 0.02 s
    python benchmarks/scale/overhead.py --quick --profile
    python benchmarks/scale/overhead.py --quick --ray   # Ray Tune too (pip install ray[tune])
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


def _nap(d: float) -> float:
    time.sleep(d)
    return d


def plain_dask(n: int, d: float) -> dict:
    """The same sleeps as plain Dask tasks on the same workers (one thread each)."""
    from dasktune.runtime import get_client

    client, _ = get_client()
    wall = time.perf_counter()
    futures = client.map(_nap, [d] * n, pure=False)
    client.gather(futures)
    wall = time.perf_counter() - wall
    del futures
    return {"trials": n, "d_s": d, "reference": "dask", "floor_s": n * d / SLOTS,
            "wall_s": wall, "ratio": wall / (n * d / SLOTS)}


def _ray_child(n: int, d: float) -> None:
    """``--ray-child``: the same trials through Ray Tune; prints the fit's wall time."""
    import ray
    from ray import tune as ray_tune

    def sleeper(config):
        time.sleep(config["d"])
        ray_tune.report({"loss": config["x"]})

    def run(k: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            tuner = ray_tune.Tuner(
                sleeper, param_space={"x": ray_tune.uniform(0, 1), "d": d},
                tune_config=ray_tune.TuneConfig(num_samples=k, metric="loss", mode="min",
                                                reuse_actors=True),
                run_config=ray_tune.RunConfig(name="overhead", storage_path=tmp, verbose=0))
            t = time.perf_counter()
            tuner.fit()
            return time.perf_counter() - t

    ray.init(num_cpus=SLOTS, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    run(20)  # warm, as for dasktune
    print(json.dumps({"wall_s": run(n)}), flush=True)


def ray_tune(n: int, d: float) -> dict:
    """The same trials through Ray Tune, in a subprocess (Ray and Dask each own a cluster)."""
    out = subprocess.run([sys.executable, __file__, "--ray-child", f"{n},{d}"],
                         capture_output=True, text=True, check=True)
    wall = json.loads(out.stdout.strip().splitlines()[-1])["wall_s"]
    return {"trials": n, "d_s": d, "reference": "ray", "floor_s": n * d / SLOTS,
            "wall_s": wall, "ratio": wall / (n * d / SLOTS)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-loggers", action="store_true")
    ap.add_argument("--case", help="one case N,d instead (e.g. 400,0.05)")
    ap.add_argument("--ray", action="store_true", help="Ray Tune as a reference too")
    ap.add_argument("--ray-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ray_child:
        n, d = args.ray_child.split(",")
        return _ray_child(int(n), float(d))
    cases = [(200, 0.1), (1000, 0.02)] if args.quick else [(2000, 0.1), (10000, 0.02)]
    if args.case:
        n, d = args.case.split(",")
        cases = [(int(n), float(d))]
    rows = []
    tune.init(num_cpus=SLOTS)
    try:
        one(20, 0.01, False, True)  # warm the workers (imports, first actors)
        plain_dask(20, 0.01)
        for n, d in cases:
            mine = one(n, d, args.profile, not args.no_loggers)
            emit(mine)
            rows.append((mine, plain_dask(n, d)))
            emit(rows[-1][1])
    finally:
        tune.shutdown()
    if args.ray:
        for i, (n, d) in enumerate(cases):
            rows[i] += (ray_tune(n, d),)
            emit(rows[i][-1])
    for mine, *refs in rows:
        print(f"{mine['trials']} x {mine['d_s']} s: dasktune {mine['ratio']:.3f} of the floor; "
              + "; ".join(f"{r['reference']} {r['ratio']:.3f} (dasktune/{r['reference']} "
                          f"{mine['wall_s'] / r['wall_s']:.3f})" for r in refs),
              file=sys.stderr)


if __name__ == "__main__":
    main()
