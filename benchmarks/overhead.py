"""Per-trial, per-report and per-checkpoint overhead: dasktune against Ray Tune.

Both run the same trainables through the same facade (``import dasktune as tune`` /
``from ray import tune``), each case in a fresh subprocess, alternating frameworks,
on a 2-CPU local cluster (``dasktune.init(num_cpus=2)`` / ``ray.init(num_cpus=2)``).
Ray runs with its best setting (``reuse_actors=True``) unless ``--ray-default``.
Prints each figure and the ratio dasktune/Ray (higher is better for rates).

    python benchmarks/overhead.py            # all cases, Ray if installed
    python benchmarks/overhead.py --quick    # smaller cases
    python benchmarks/overhead.py --only dasktune --case driver
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

CASES = ("trials", "reports", "checkpoints", "driver")


def _tune(framework: str):
    if framework == "ray":
        import ray
        from ray import tune

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        return tune, ray.shutdown
    import dasktune as tune

    tune.init(num_cpus=2)
    return tune, tune.shutdown


class _PeakRSS:
    """Peak resident memory of this process and all its children, sampled."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                procs = [self._proc, *self._proc.children(recursive=True)]
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.2)

    def __enter__(self) -> _PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_case(framework: str, case: str, quick: bool, ray_default: bool) -> dict:
    tune, shutdown = _tune(framework)
    storage = tempfile.mkdtemp(prefix=f"bench-{framework}-")
    reuse = framework == "ray" and not ray_default
    tc_extra = {"reuse_actors": True} if reuse else {}
    out: dict = {"framework": framework, "case": case}

    def rc(name: str):
        kwargs = {"name": name, "storage_path": storage, "verbose": 0}
        return tune.RunConfig(**kwargs)

    with _PeakRSS() as mem:
        if case == "trials":
            n = 50 if quick else 200

            def trivial(config):
                for i in range(10):
                    tune.report({"v": i})

            t0 = time.perf_counter()
            tune.Tuner(trivial, param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(num_samples=n, **tc_extra),
                       run_config=rc("trials")).fit()
            dt = time.perf_counter() - t0
            out.update(trials=n, seconds=dt, rate=n / dt, unit="trials/s")
        elif case == "reports":
            per = 500 if quick else 2000

            def chatty(config):
                for i in range(per):
                    tune.report({"v": i, "loss": 1.0 / (i + 1)})

            t0 = time.perf_counter()
            tune.Tuner(chatty, param_space={"x": tune.grid_search([0, 1, 2, 3])},
                       tune_config=tune.TuneConfig(**tc_extra), run_config=rc("reports")).fit()
            dt = time.perf_counter() - t0
            out.update(reports=4 * per, seconds=dt, rate=4 * per / dt, unit="reports/s")
        elif case == "checkpoints":
            per = 10 if quick else 40
            payload = os.urandom(1 << 20)

            def saver(config):
                d = tempfile.mkdtemp()
                for i in range(per):
                    with open(os.path.join(d, "blob.bin"), "wb") as f:
                        f.write(payload)
                    tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(d))

            t0 = time.perf_counter()
            tune.Tuner(saver, param_space={"x": tune.grid_search([0, 1])},
                       tune_config=tune.TuneConfig(**tc_extra),
                       run_config=rc("checkpoints")).fit()
            dt = time.perf_counter() - t0
            out.update(checkpoints=2 * per, seconds=dt, rate=2 * per / dt,
                       unit="1MiB checkpoints/s")
        elif case == "driver":
            # Driver CPU per report for growing totals (dasktune only: flat is the goal).
            rows = []
            for total in ((1000, 10000) if quick else (1000, 10000, 100000)):
                per = total // 4

                def many(config, per=per):
                    for i in range(per):
                        tune.report({"v": i})

                c0, t0 = time.process_time(), time.perf_counter()
                tune.Tuner(many, param_space={"x": tune.grid_search([0, 1, 2, 3])},
                           run_config=rc(f"driver{total}")).fit()
                rows.append({"reports": total, "driver_cpu_us_per_report":
                             1e6 * (time.process_time() - c0) / total,
                             "wall_s": time.perf_counter() - t0})
            out.update(rows=rows)
    out["peak_rss_mib"] = mem.peak / 2**20
    shutdown()
    return out


def _child(framework: str, case: str, quick: bool, ray_default: bool) -> dict | None:
    cmd = [sys.executable, __file__, "--child", framework, "--case", case]
    if quick:
        cmd.append("--quick")
    if ray_default:
        cmd.append("--ray-default")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.stderr.write(f"{framework}/{case} failed:\n{proc.stderr[-3000:]}\n")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=CASES, action="append")
    parser.add_argument("--only", choices=("dasktune", "ray"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ray-default", action="store_true",
                        help="Ray with reuse_actors=False (its default; very slow)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child, args.case[0], args.quick, args.ray_default)))
        return
    frameworks = [args.only] if args.only else ["dasktune", "ray"]
    if "ray" in frameworks:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray is not installed (pip install 'dasktune[bench]'); dasktune only")
            frameworks = ["dasktune"]
    for case in args.case or CASES:
        fws = ["dasktune"] if case == "driver" else frameworks
        results = {fw: _child(fw, case, args.quick, args.ray_default) for fw in fws}
        print(f"\n== {case}")
        for fw, r in results.items():
            if r is None:
                continue
            if case == "driver":
                for row in r["rows"]:
                    print(f"  {fw:9} {row['reports']:>7} reports: "
                          f"{row['driver_cpu_us_per_report']:.1f} us driver CPU/report, "
                          f"{row['wall_s']:.1f}s wall")
            else:
                print(f"  {fw:9} {r['rate']:10.1f} {r['unit']}  ({r['seconds']:.1f}s, "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB)")
        d, ray_r = results.get("dasktune"), results.get("ray")
        if d and ray_r and case != "driver":
            print(f"  ratio dasktune/ray: {d['rate'] / ray_r['rate']:.1f}x rate, "
                  f"{d['peak_rss_mib'] / ray_r['peak_rss_mib']:.2f}x memory")


if __name__ == "__main__":
    main()
