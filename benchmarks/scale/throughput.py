"""Sustained reports/s into the driver, loggers on and off, at 8/64/256 concurrent trials.

``real``: trials on the embedded cluster (2 worker processes, CPU=1 each; each trial asks
for 0.01 CPU so all of them run at once), each reporting as fast as it can (FIFO: reports
travel in batches). The rate is counted by a callback between the first and the last
result the driver saw. On this 2-core machine the trial threads, the workers and the
driver share two cores, so the real figure is a floor; ``sim`` runs the same driver loop
on the simulated executor (no Dask, no trial threads): what the driver alone can absorb.
Every run checks that each trial's results arrived complete and in order.

    python benchmarks/scale/throughput.py            # real 8/64, sim 8/64/256
    python benchmarks/scale/throughput.py --quick    # fewer reports
    python benchmarks/scale/throughput.py --real 8,64,256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import LazySteps, emit, no_loggers  # noqa: E402

import dasktune as tune  # noqa: E402
from dasktune.callback import Callback  # noqa: E402
from dasktune.simulator import SimulatedExecutor, run_simulated  # noqa: E402


class Rate(Callback):
    """Counts results and checks each trial's come in order, 1, 2, 3, ..."""

    def __init__(self):
        self.first = self.last = 0.0
        self.count = 0
        self.seen: dict[str, int] = defaultdict(int)
        self.bad = 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        now = time.perf_counter()
        if not self.count:
            self.first = now
        self.last = now
        self.count += 1
        it = result["training_iteration"]
        if it != self.seen[trial.trial_id] + 1:
            self.bad += 1
        self.seen[trial.trial_id] = it

    def rate(self) -> float:
        return (self.count - 1) / max(self.last - self.first, 1e-9)


def chatty(config):
    for i in range(config["n"]):
        tune.report({"loss": 1.0 / (i + 1)})


def real(concurrency: int, per_trial: int, loggers: bool) -> dict:
    rate = Rate()
    callbacks = [rate] + ([] if loggers else no_loggers())
    with tempfile.TemporaryDirectory() as tmp:
        rc = tune.RunConfig(name="tp", storage_path=tmp, verbose=0, callbacks=callbacks)
        tc = tune.TuneConfig(num_samples=concurrency, max_concurrent_trials=concurrency)
        tune.Tuner(tune.with_resources(chatty, {"cpu": 0.01}),
                   param_space={"n": per_trial}, tune_config=tc, run_config=rc).fit()
    return _row("real", concurrency, per_trial, loggers, rate)


def sim(concurrency: int, per_trial: int, loggers: bool) -> dict:
    rate = Rate()
    ex = SimulatedExecutor(concurrency, trial_model=lambda c, t: LazySteps(per_trial, 1.0))
    with tempfile.TemporaryDirectory() as tmp:
        rc = tune.RunConfig(name="tp", storage_path=tmp, callbacks=[rate])
        tc = tune.TuneConfig(num_samples=concurrency, max_concurrent_trials=concurrency)
        run_simulated("tp", {"x": 1}, tc, rc, executor=ex, loggers=loggers)
    return _row("sim", concurrency, per_trial, loggers, rate)


def _row(kind: str, concurrency: int, per_trial: int, loggers: bool, rate: Rate) -> dict:
    expected = concurrency * per_trial
    assert rate.count == expected and not rate.bad, (rate.count, expected, rate.bad)
    return {"executor": kind, "concurrent": concurrency, "reports": rate.count,
            "loggers": loggers, "reports_per_s": rate.rate()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--real", default="8,64")
    ap.add_argument("--sim", default="8,64,256")
    args = ap.parse_args()
    total = 20000 if args.quick else 100000
    tune.init(num_cpus=2)
    try:
        real(2, 10, True)  # warm up
        for c in [int(x) for x in args.real.split(",") if x]:
            for loggers in (False, True):
                emit(real(c, max(total // c, 1), loggers))
    finally:
        tune.shutdown()
    for c in [int(x) for x in args.sim.split(",") if x]:
        for loggers in (False, True):
            emit(sim(c, max(total // c, 1), loggers))


if __name__ == "__main__":
    main()
