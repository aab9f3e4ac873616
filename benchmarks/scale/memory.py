"""Driver memory against the number of reports: 1k / 10k / 100k / 1M.

Each size runs in a fresh process; a sampler thread records the driver's peak RSS
during ``fit()``. ``real``: 10 and 100 concurrent trials on the embedded cluster, loggers
on (results stream to storage). ``sim``: 100 trials on the simulated executor, loggers
on. The figure is the growth of peak RSS over the RSS before ``fit()``: once the driver's
report pipeline is full (``executor.max-reports-in-flight``) it should grow with neither
the number of reports nor the number of trials.

    python benchmarks/scale/memory.py            # sim 1k-100k, real 1k-1M at 10 and 100 trials
    python benchmarks/scale/memory.py --quick    # sim 1k-100k, real 1k-100k at 10 trials
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import LazySteps, emit, rss_mb  # noqa: E402

import dasktune as tune  # noqa: E402


def chatty(config):
    for i in range(config["n"]):
        tune.report({"loss": 1.0 / (i + 1), "i": i})


class Peak:
    def __init__(self):
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mb())

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        return max(self.peak, rss_mb())


def child(kind: str, reports: int, trials: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rc = tune.RunConfig(name="mem", storage_path=tmp, verbose=0)
        if kind == "real":
            tune.init(num_cpus=2)
            tc = tune.TuneConfig(num_samples=trials, max_concurrent_trials=trials)
            tuner = tune.Tuner(tune.with_resources(chatty, {"cpu": 0.01}),
                               param_space={"n": reports // trials}, tune_config=tc,
                               run_config=rc)
            tune.Tuner(chatty, param_space={"n": 2},  # warm: imports, actors, loggers
                       tune_config=tune.TuneConfig(num_samples=2),
                       run_config=tune.RunConfig(name="warm", storage_path=tmp, verbose=0)).fit()
            base = rss_mb()
            peak = Peak()
            tuner.fit()
            top = peak.stop()
            tune.shutdown()
        else:
            from dasktune.simulator import SimulatedExecutor, run_simulated

            ex = SimulatedExecutor(trials, trial_model=lambda c, t: LazySteps(reports // trials,
                                                                              1.0))
            run_simulated("warm", {"x": 1}, tune.TuneConfig(num_samples=2), rc,
                          executor=SimulatedExecutor(2, trial_model=lambda c, t:
                                                     LazySteps(2, 1.0)), loggers=True)
            base = rss_mb()
            peak = Peak()
            run_simulated("mem", {"x": 1}, tune.TuneConfig(num_samples=trials), rc,
                          executor=ex, loggers=True)
            top = peak.stop()
    print(json.dumps({"executor": kind, "trials": trials, "reports": reports,
                      "rss_before_mb": base, "rss_peak_mb": top, "growth_mb": top - base}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=3)
    ap.add_argument("--only", choices=("sim", "real"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    real_sizes = (1000, 10000, 100000) if args.quick else (1000, 10000, 100000, 1000000)
    plan = [("sim", n, 100) for n in (1000, 10000, 100000)]
    plan += [("real", n, t) for t in ((10,) if args.quick else (10, 100)) for n in real_sizes]
    plan = [(k, n, t) for k, n, t in plan if args.only in (None, k)]
    for kind, n, trials in plan:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(trials)],
                             capture_output=True, text=True, timeout=1200)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{kind} {n} x {trials} failed")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["wall_s"] = time.perf_counter() - t
        emit(row)


if __name__ == "__main__":
    main()
