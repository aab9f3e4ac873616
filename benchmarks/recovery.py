"""Recovery figures for issue 4: how fast a trial runs again after its worker is SIGKILLed
or frozen (SIGSTOP), how many iterations each kill costs, and the wall-time overhead of kills.

Real ``dask scheduler`` / ``dask worker --no-nanny`` processes on 127.0.0.1. Usage::

    .venv/bin/python benchmarks/recovery.py [--kills 10] [--stops 3] [--worker-ttl 5s]
        [--overhead-kills 5]

1. Resume latency: one trial at a time; at a seeded iteration its worker is SIGKILLed
   and a replacement started. Measured: signal -> driver notices (``on_trial_recover``)
   and signal -> the new attempt's trainable running (its first line in the side file).
2. Iterations lost per kill: iterations the killed attempt executed past the checkpoint
   the next attempt resumed from (checkpoint every ``k``; at most ``k``).
3. Overhead: the same 8-trial experiment (``--iters`` iterations of 0.1 s each) with and
   without ``--overhead-kills`` kills (ratio of wall times). The kill moments are seeded
   iterations spread over the run (one per slice), each victim a random running trial's worker,
   and each killed worker is replaced, as a cluster manager keeps a pool at its size; the
   next kill waits until the replacement has joined (``--kill-before-replaced`` drops that
   wait). Without the wait, kills come faster than a Python worker process starts (about
   1.5-2.5 s on two shared CPUs), so the trials of the next killed worker find no free
   slot and the figure measures interpreter start-up, not recovery.
4. A frozen worker: as 1, but the worker is SIGSTOPped (alive to the kernel, its
   connections open, answering nothing), then SIGKILLed once the trial runs elsewhere.
   Only a timeout can notice it: the scheduler's ``distributed.scheduler.worker-ttl``
   (``--worker-ttl``, set on this benchmark's scheduler; Dask's default is 5 minutes)
   removes it, or a poll of the trial's actor gets no answer for
   ``dasktune.executor.unresponsive-timeout`` (30 s), whichever comes first.
   ``--stops 0`` skips this part.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import dasktune as tune


def trainable(config: dict[str, Any]) -> None:
    ctx = tune.get_context()
    d, attempt = ctx.get_trial_dir(), ctx.get_attempt()
    restored = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as c, open(os.path.join(c, "s.json")) as f:
            restored = json.load(f)["i"]
    with open(os.path.join(d, "attempts.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": attempt, "pid": os.getpid(), "restored": restored,
                            "t": time.time()}) + "\n")
    for i in range(restored + 1, config["iters"] + 1):
        time.sleep(config["sleep"])
        with open(os.path.join(d, "executed.jsonl"), "a") as f:
            f.write(json.dumps({"attempt": attempt, "it": i, "t": time.time()}) + "\n")
        ck = tmp = None
        if i % config["k"] == 0:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "s.json"), "w") as f:
                json.dump({"i": i}, f)
            ck = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i}, checkpoint=ck)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


class Cluster:
    """A scheduler and no-nanny workers; we kill worker PIDs ourselves."""

    def __init__(self, logdir: str, worker_ttl: str | None = None):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        self.logdir = logdir
        self.env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}
        if worker_ttl:
            self.env["DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL"] = worker_ttl
        self.procs: list[subprocess.Popen] = []
        self.procs.append(self._spawn(
            ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--dashboard-address", "127.0.0.1:0"], "scheduler"))
        self.workers: list[subprocess.Popen] = []
        self._client: Any = None

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(os.path.join(self.logdir, f"{name}-{len(self.procs)}.log"), "wb")
        return subprocess.Popen([sys.executable, "-m", *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def add_worker(self, cpus: int) -> subprocess.Popen:
        p = self._spawn(["distributed.cli.dask_worker", self.address, "--nthreads", "1",
                         "--no-dashboard", "--host", "127.0.0.1", "--no-nanny",
                         "--resources", f"CPU={cpus}"], "worker")
        self.procs.append(p)
        self.workers.append(p)
        return p

    def wait_workers(self, n: int) -> None:
        """Until the scheduler has ``n`` workers (a replacement has joined)."""
        from distributed import Client

        if self._client is None:
            self._client = Client(self.address, set_as_default=False)
        self._client.wait_for_workers(n, timeout=60)

    def live(self, pid: int) -> subprocess.Popen | None:
        return next((p for p in self.workers if p.pid == pid and p.poll() is None), None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


class Recovered(tune.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.times.append(time.time())


def _wait(pred, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise TimeoutError("benchmark condition not reached")


def run_experiment(cluster: Cluster, root: str, name: str, n_trials: int, kills: int,
                   seed: int, iters: int, k: int, sleep: float, cpus: int,
                   wait_replaced: bool = True, sig: int = signal.SIGKILL) -> dict[str, Any]:
    """One experiment; ``kills`` workers SIGKILLed (each replaced) at seeded moments;
    with ``sig=signal.SIGSTOP`` frozen instead, and SIGKILLed once the trial runs again.

    Kill ``j`` happens once a randomly chosen running trial has passed a random
    iteration in the ``j``-th of ``kills`` equal slices of the first 60% of the run (the
    replacements' start-up delays kills, and one near the end may find every trial done); with ``wait_replaced`` the next kill
    also waits for the killed worker's replacement to join."""
    rng = random.Random(seed)
    span = (int(iters * 0.6) - 2) / max(kills, 1)
    moments = [rng.randint(2 + int(j * span), 2 + int((j + 1) * span) - 1)
               for j in range(kills)]
    n_workers = len([p for p in cluster.workers if p.poll() is None])
    cb = Recovered()
    exp = os.path.join(root, name)
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search(list(range(n_trials))), "iters": iters, "k": k,
                     "sleep": sleep},
        run_config=tune.RunConfig(name=name, storage_path=root, verbose=0, callbacks=[cb]))
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", tuner.fit()), daemon=True)
    t0 = time.time()
    thread.start()
    events = []
    for at in moments:
        # Shuffled once per kill: the victim is a random eligible trial, not the first.
        order_seed = rng.random()

        def victim(at: int = at, order_seed: float = order_seed) -> Any:
            if not os.path.isdir(exp):
                return None
            names = sorted(os.listdir(exp))
            random.Random(order_seed).shuffle(names)
            for d in names:
                attempts = _jsonl(os.path.join(exp, d, "attempts.jsonl"))
                if not attempts:
                    continue
                a = attempts[-1]
                done = [r["it"] for r in _jsonl(os.path.join(exp, d, "executed.jsonl"))
                        if r["attempt"] == a["attempt"]]
                p = cluster.live(a["pid"])
                if p is not None and done and at <= max(done) < iters:
                    return p, d, a["attempt"], len(attempts)
            return None

        try:
            proc, d, attempt, n_attempts = _wait(victim)
        except TimeoutError:
            state = os.path.join(exp, "experiment_state.json")
            with open(state) as f:
                placements = [t["placements"] for t in json.load(f)["trials"]]
            seen = {d: _jsonl(os.path.join(exp, d, "attempts.jsonl")) for d in os.listdir(exp)}
            raise TimeoutError(f"{name}: no running trial past iteration {at}; "
                               f"placements {placements}; attempts {seen}; workers "
                               f"{[(p.pid, p.poll()) for p in cluster.workers]}") from None
        n_recovered = len(cb.times)
        t_kill = time.time()
        os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(10)
        cluster.add_worker(cpus)
        path = os.path.join(exp, d, "attempts.jsonl")
        # A frozen worker is noticed only after a timeout (worker-ttl, or the driver's
        # unresponsive-timeout of 30 s): wait long enough for either.
        patience = 60.0 if sig == signal.SIGKILL else 120.0
        nxt = _wait(lambda n=n_attempts, path=path: (lambda a: a[n] if len(a) > n else None)(
            _jsonl(path)), patience)
        _wait(lambda n=n_recovered: len(cb.times) > n, patience)
        if sig != signal.SIGKILL:  # it runs elsewhere: the frozen one goes for good
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if wait_replaced:
            cluster.wait_workers(n_workers)
        reached = max(r["it"] for r in _jsonl(os.path.join(exp, d, "executed.jsonl"))
                      if r["attempt"] == attempt)
        events.append({"noticed_s": cb.times[n_recovered] - t_kill,
                       "running_s": nxt["t"] - t_kill, "lost": reached - nxt["restored"]})
    thread.join(300)
    wall = time.time() - t0
    results = out["r"]
    assert results.num_terminated == n_trials and not results.errors
    return {"wall_s": wall, "events": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=10, help="kills for the latency median")
    ap.add_argument("--overhead-kills", type=int, default=5)
    ap.add_argument("--stops", type=int, default=3,
                    help="SIGSTOPped (frozen) workers, each in an experiment of its own")
    ap.add_argument("--worker-ttl", default="5s",
                    help="distributed.scheduler.worker-ttl of the benchmark's scheduler")
    ap.add_argument("--iters", type=int, default=150,
                    help="iterations (0.1 s each) per trial of the overhead experiment")
    ap.add_argument("--kill-before-replaced", action="store_true",
                    help="do not wait for a killed worker's replacement before the next kill")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="dasktune-recovery-")
    cluster = Cluster(root, worker_ttl=args.worker_ttl)
    try:
        for _ in range(3):
            cluster.add_worker(4)
        from distributed import Client

        with Client(cluster.address, set_as_default=False) as c:
            c.wait_for_workers(3, timeout=60)
        tune.init(address=cluster.address)
        # 1+2: one kill at a time, one trial per experiment so nothing else competes.
        lat = []
        for i in range(args.kills):
            r = run_experiment(cluster, root, f"latency-{i}", n_trials=1, kills=1, seed=i,
                               iters=12, k=3, sleep=0.1, cpus=4)
            lat += r["events"]
        noticed = [e["noticed_s"] for e in lat]
        running = [e["running_s"] for e in lat]
        lost = [e["lost"] for e in lat]
        print(f"SIGKILL -> driver notices:       median {statistics.median(noticed):.3f}s "
              f"(min {min(noticed):.3f}, max {max(noticed):.3f}) over {len(lat)} kills")
        print(f"SIGKILL -> trial running again:  median {statistics.median(running):.3f}s "
              f"(min {min(running):.3f}, max {max(running):.3f})")
        print(f"iterations lost per kill (k=3):  mean {statistics.mean(lost):.2f}, "
              f"max {max(lost)}  {lost}")
        # 4: a frozen worker, noticed only by a timeout.
        if args.stops:
            frozen = []
            for i in range(args.stops):
                r = run_experiment(cluster, root, f"frozen-{i}", n_trials=1, kills=1,
                                   seed=100 + i, iters=12, k=3, sleep=0.1, cpus=4,
                                   sig=signal.SIGSTOP)
                frozen += r["events"]
            noticed = [e["noticed_s"] for e in frozen]
            running = [e["running_s"] for e in frozen]
            print(f"SIGSTOP -> driver notices:       median {statistics.median(noticed):.3f}s "
                  f"(min {min(noticed):.3f}, max {max(noticed):.3f}) over {len(frozen)} "
                  f"stops, worker-ttl {args.worker_ttl}")
            print(f"SIGSTOP -> trial running again:  median {statistics.median(running):.3f}s "
                  f"(min {min(running):.3f}, max {max(running):.3f})")
        # 3: overhead of kills on a whole experiment.
        base = run_experiment(cluster, root, "base", n_trials=8, kills=0, seed=0,
                              iters=args.iters, k=4, sleep=0.1, cpus=4)
        chaos = run_experiment(cluster, root, "chaos", n_trials=8, kills=args.overhead_kills,
                               seed=1, iters=args.iters, k=4, sleep=0.1, cpus=4,
                               wait_replaced=not args.kill_before_replaced)
        print(f"8 trials x {args.iters} it (k=4): fault-free {base['wall_s']:.2f}s, with "
              f"{len(chaos['events'])} kills {chaos['wall_s']:.2f}s, ratio "
              f"{chaos['wall_s'] / base['wall_s']:.2f}x; lost per kill "
              f"{[e['lost'] for e in chaos['events']]}")
    finally:
        tune.shutdown()
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
