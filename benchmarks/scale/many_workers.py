"""Many workers on this machine: placement and bookkeeping cost per trial against the
worker count, and losing 10% of the workers at once.

Real ``dask scheduler`` + W ``dask worker --nthreads 1 --no-nanny`` processes on
127.0.0.1 (W = 16, 64, 128 by default), with ``--preload dasktune.actor`` as
``dasktune worker`` starts them. Each run: 4·W tiny trials (a few reports of a
few ms each), one per worker slot at a time, loggers off (they are per report, not per
worker; see throughput.py). Printed per W: the driver's CPU per trial (must not grow
with W), wall time, and in the ``--kill`` run the trials that ended ERROR (must be 0)
after 10% of the workers were SIGKILLed together while their trials ran.

    python benchmarks/scale/many_workers.py                  # W = 16, 64, 128
    python benchmarks/scale/many_workers.py --workers 8,32   # smaller
    python benchmarks/scale/many_workers.py --stock          # Dask's default worker config

The workers run with ``LEAN`` housekeeping (below) unless ``--stock``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import emit, no_loggers  # noqa: E402

import dasktune as tune  # noqa: E402

# Dask's per-process housekeeping, tuned for many workers packed on few cores: each idle
# worker by default samples its threads' stacks every 10 ms (the dashboard's profile),
# checks its event loop every 20 ms and reads its own /proc stats every 0.5 s. That is
# ~150 wake-ups a second per process: 128 idle workers kept 2 cores' load near 100.
# Operators packing workers densely set the same (it only coarsens diagnostics).
LEAN = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A scheduler and ``n`` single-thread workers, killed by PID on close."""

    def __init__(self, n: int, logdir: str, lean: bool = True) -> None:
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.logdir = logdir
        self.env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "30s",
                    **(LEAN if lean else {})}
        self.scheduler = self._spawn("scheduler", [
            "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
            "--port", self.address.rsplit(":", 1)[1], "--no-dashboard"])
        self.workers = [self._spawn(f"worker-{i}", [
            "distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
            "--no-dashboard", "--host", "127.0.0.1", "--resources", "CPU=1",
            "--memory-limit", "0", "--preload", "dasktune.actor"]) for i in range(n)]

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.logdir, f"{name}.log"), "wb")
        return subprocess.Popen([sys.executable, "-m", *argv], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, client, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(client.scheduler_info()['workers'])} of {n} "
                                   f"workers joined in {timeout:.0f}s")
            time.sleep(0.5)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.kill()
        for p in [*self.workers, self.scheduler]:
            p.wait()


def tiny(config):
    for i in range(5):
        time.sleep(0.005)
        tune.report({"loss": config["x"] / (i + 1)})


class KillTenPercent(tune.Callback):
    """Once every worker runs a trial, SIGKILLs 10% of the workers at once."""

    def __init__(self, cluster: Cluster, n: int) -> None:
        self.cluster = cluster
        self.n = n
        self.done = False
        self.killed = 0

    def on_trial_start(self, iteration, trials, trial, **info):
        running = sum(t.status == "RUNNING" for t in trials)
        if not self.done and running >= self.n:
            self.done = True
            victims = random.Random(0).sample(self.cluster.workers, max(1, self.n // 10))
            for p in victims:
                os.kill(p.pid, signal.SIGKILL)
            self.killed = len(victims)


def run(n: int, kill: bool, lean: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(n, tmp, lean)
        try:
            client = tune.init(address=cluster.address)
            cluster.wait(client, n, timeout=60 + 2 * n)
            killer = KillTenPercent(cluster, n) if kill else None
            callbacks = [*no_loggers(), *([killer] if killer else [])]
            rc = tune.RunConfig(name="many", storage_path=os.path.join(tmp, "r"), verbose=0,
                                callbacks=callbacks,
                                failure_config=tune.FailureConfig(max_failures=3))
            tc = tune.TuneConfig(num_samples=4 * n, metric="loss", mode="min")
            cpu, wall = time.process_time(), time.perf_counter()
            results = tune.Tuner(tiny, param_space={"x": tune.uniform(0, 1)},
                                 tune_config=tc, run_config=rc).fit()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            tune.shutdown()
            cluster.close()
    complete = sum(r.metrics.get("training_iteration") == 5 for r in results)
    return {"workers": n, "trials": 4 * n, "kill_10pct": kill, "lean": lean,
            "killed": killer.killed if killer else 0, "errors": results.num_errors,
            "complete": complete, "wall_s": wall,
            "driver_cpu_ms_per_trial": 1000 * cpu / (4 * n)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="16,64,128")
    ap.add_argument("--stock", action="store_true",
                    help="workers with Dask's default housekeeping intervals (see LEAN)")
    args = ap.parse_args()
    # A SIGTERM (say, from `timeout`) unwinds like Ctrl-C, so `Cluster.close` still
    # kills the worker processes this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for n in [int(x) for x in args.workers.split(",") if x]:
        emit(run(n, kill=False, lean=not args.stock))
        emit(run(n, kill=True, lean=not args.stock))


if __name__ == "__main__":
    main()
