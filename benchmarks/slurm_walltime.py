"""Walltime moves on a real Slurm (issue 25): what each move costs.

1-core Slurm jobs with a short walltime, between ``--minimum`` and ``--maximum`` jobs, run
``--trials`` trials each longer than one job, so every trial moves at least once as its job
nears its limit. The jobs come from dasktune's slurm provider (``--via cluster-file``: its
head asks for a replacement ahead of each end) or from a plain
``dask_jobqueue.SLURMCluster(...).adapt()`` (``--via adapt``). Usage (as root, after
``bash scripts/slurm-local.sh``)::

    .venv/bin/python benchmarks/slurm_walltime.py --trainable class
    .venv/bin/python benchmarks/slurm_walltime.py --trainable function --lifetime 45s
    .venv/bin/python benchmarks/slurm_walltime.py --via adapt

Measured per run:

- iterations lost per move: iterations an attempt executed that a later attempt ran again
  (0 where the trial checkpointed on demand before it left);
- pause per move: from the last iteration an attempt executed to the first the next one
  executed, less one iteration's sleep (the time the trial did not run);
- idle share: 1 - (trial-seconds run) / (worker-seconds alive), sampling the scheduler's
  worker count every 0.5 s from the first worker's arrival to the experiment's end.

Closing note (2026-12-06, the one-node Slurm of ``scripts/slurm-local.sh`` on the 2-core
development VM; 1-minute jobs, margin 20 s, replace-ahead 30 s, 2 trials of 90 x 1 s,
checkpoint every 10 for the function trainable, ``--minimum 2 --maximum 4``)::

    via           trainable  --lifetime  moves  iters lost/move  pause median/max  idle  ERRORs
    cluster-file  class      -           8      0                0.42 / 4.59 s     0.28  0
    cluster-file  function   -           7      0                0.16 / 4.83 s     0.34  0
    cluster-file  class      30s         8      0                0.22 / 4.60 s     0.21  1+1 *
    cluster-file  function   30s         8      1.88 (0-8)       0.35 / 6.21 s     0.29  8+8 *
    adapt (max 3) class      -           6      0                28.66 / 29.13 s   0.45  0  (a)
    adapt (max 3) class      -           6      0                5.37 / 40.2 s     0.26  0  (b)
    adapt (max 4) class      -           7      0                0.21 / 28.83 s    0.38  3 **

(a) before, (b) after :class:`~dasktune.cluster.walltime.WalltimeTargetPlugin` (each
worker about to retire adds one to the scheduler's adaptive target, so ``Adaptive`` asks
for its replacement ahead; with two jobs ending together and room for one, the second
still waits for the queue). ``**``: distributed's nanny ``Worker process died
unexpectedly`` as a closed worker's process exits (its stop queue closed under it).

``*``: distributed's ``ConnectionPool is closed`` (and tornado's report of it) from a worker
that reaches ``--lifetime`` holding a trial actor: its own retirement is refused for the
actor and the scheduler's status revert lands in the middle of its close; the
function+lifetime row was measured before the driver stopped re-retiring closing workers
(after: 3+2 in a 60-iteration run). Before this work (issue 25), each move paused 8-11 s.
The idle share counts the replacement job that waits ahead of each end.

Rerun once the worker plugin kept a closing worker closing (a ``--lifetime`` close no longer
runs twice), same machine and settings, 2026-12-06::

    for t in class function; do for l in "" "--lifetime 30s"; do
      .venv/bin/python benchmarks/slurm_walltime.py --trainable $t $l \
        --trials 2 --iters 90 --minimum 2 --maximum 4; done; done

    via           trainable  --lifetime  moves  iters lost/move  pause median/max  idle  ERRORs
    cluster-file  class      -           8      0                0.21 / 4.81 s     0.32  0
    cluster-file  function   -           7      0                0.27 / 7.44 s     0.36  0
    cluster-file  class      30s         8      0                0.26 / 4.60 s     0.28  0
    cluster-file  function   30s         8      2.12 (0-9)       0.23 / 5.44 s     0.36  0

With ``--lifetime`` no worker logs an ERROR any more (was 1+1 and 8+8). A function
trainable still loses the iterations since its last checkpoint (every 10 here) when its
worker reaches ``--lifetime`` first: Dask closes it then, and the trial gets only
``dasktune.executor.evacuate-timeout`` (6 s) to reach a checkpoint.

Rerun once the walltime plugin retired a worker before its ``--lifetime`` too (the margin,
capped at a quarter of the lifetime: 7-9 s before its end here), same settings, the
machine quiet, 2026-12-06; "before" is the plugin without it, run beside it::

    .venv/bin/python benchmarks/slurm_walltime.py --trainable function --lifetime 30s \
        --trials 2 --iters 90 --minimum 2 --maximum 4     # and --trainable class, etc.

    via           trainable  --lifetime  moves  iters lost/move  pause median/max  idle  ERRORs
    cluster-file  function   30s  before 8      3.38 (0-8)       0.06 / 0.45 s     0.43  0
    cluster-file  function   30s         8      0                0.04 / 0.06 s     0.42  0
    cluster-file  class      -           8      0                0.06 / 0.07 s     0.43  0
    cluster-file  function   -           4      0                0.07 / 0.09 s     0.44  0
    cluster-file  class      30s         11     0                0.06 / 0.24 s     0.38  0

Function trainables checkpointing every 10 s lose nothing at a 30 s lifetime: the worker
retires 7-9 s ahead, and a trial still there at the lifetime has Dask's 6 s more.

``--lifetime`` adds dask-jobqueue's documented recipe (``--lifetime X --lifetime-stagger
5s``) to the workers; without it only dasktune's walltime plugin moves the trials
(``dasktune.cluster.walltime.margin``, ``--margin`` here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

import dask

import dasktune as tune


def _log(d: str, name: str, rec: dict[str, Any]) -> None:
    with open(os.path.join(d, name), "a") as f:
        f.write(json.dumps(rec) + "\n")


def function_trainable(config: dict[str, Any]) -> None:
    """Counts to ``iters``, a checkpoint every ``k``; records what each attempt runs."""
    ctx = tune.get_context()
    d, attempt = ctx.get_trial_dir(), ctx.get_attempt()
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as c, open(os.path.join(c, "s.json")) as f:
            start = json.load(f)["i"]
    for i in range(start + 1, config["iters"] + 1):
        time.sleep(config["sleep"])
        _log(d, "executed.jsonl", {"attempt": attempt, "it": i, "t": time.time()})
        ck = None
        if i % config["k"] == 0:
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "s.json"), "w") as f:
                json.dump({"i": i}, f)
            ck = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i}, checkpoint=ck)


class ClassTrainable(tune.Trainable):
    """The same count as a class: it checkpoints on demand when its worker retires."""

    def setup(self, config: dict[str, Any]) -> None:
        self.i, self.sleep = 0, config["sleep"]
        ctx = tune.get_context()
        self.d, self.attempt = ctx.get_trial_dir(), ctx.get_attempt()

    def step(self) -> dict[str, Any]:
        time.sleep(self.sleep)
        self.i += 1
        _log(self.d, "executed.jsonl", {"attempt": self.attempt, "it": self.i,
                                        "t": time.time()})
        return {"i": self.i}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "s.json"), "w") as f:
            json.dump({"i": self.i}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "s.json")) as f:
            self.i = json.load(f)["i"]


def read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def analyse(exp_dir: str, iters: int, sleep: float) -> dict[str, Any]:
    """Per-trial iterations re-run, moves and pauses, from the trials' own records."""
    lost, pauses, moves, complete, busy = [], [], 0, 0, 0.0
    for name in sorted(os.listdir(exp_dir)):
        d = os.path.join(exp_dir, name)
        rows = read_jsonl(os.path.join(d, "executed.jsonl")) if os.path.isdir(d) else []
        if not rows:
            continue
        busy += len(rows) * sleep
        results = [r["training_iteration"] for r in read_jsonl(os.path.join(d, "result.json"))]
        complete += results == list(range(1, iters + 1))
        attempts = sorted({r["attempt"] for r in rows})
        for a, b in zip(attempts, attempts[1:]):
            mine = [r for r in rows if r["attempt"] == a]
            nxt = [r for r in rows if r["attempt"] == b]
            moves += 1
            lost.append(max(r["it"] for r in mine) - min(r["it"] for r in nxt) + 1)
            pauses.append(min(r["t"] for r in nxt) - max(r["t"] for r in mine) - sleep)
    return {"moves": moves, "iterations_lost": lost, "pauses_s": [round(p, 2) for p in pauses],
            "complete_trials": complete, "busy_s": busy}


def logged_errors(log_dir: str) -> dict[str, int]:
    """ERROR lines in the worker jobs' logs (their text after the level), with counts."""
    found: dict[str, int] = {}
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), errors="replace") as f:
            for line in f:
                if " - ERROR - " in line:
                    key = line.split(" - ERROR - ", 1)[1].strip()[:120]
                    found[key] = found.get(key, 0) + 1
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainable", choices=["class", "function"], default="class")
    ap.add_argument("--via", choices=["cluster-file", "adapt"], default="cluster-file",
                    help="dasktune's slurm provider (replacement jobs ahead of each end) "
                    "or a plain SLURMCluster.adapt()")
    ap.add_argument("--lifetime", default=None, help="e.g. 45s: dask-jobqueue's recipe")
    ap.add_argument("--walltime", default="00:01:00")
    ap.add_argument("--margin", default="20s", help="dasktune.cluster.walltime.margin")
    ap.add_argument("--replace-ahead", default="30s")
    ap.add_argument("--minimum", type=int, default=2)
    ap.add_argument("--maximum", type=int, default=3)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--iters", type=int, default=90)
    ap.add_argument("--sleep", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=10, help="function trainable: checkpoint every k")
    args = ap.parse_args()

    out = tempfile.mkdtemp(prefix="slurm-walltime-")
    extra = []
    if args.lifetime:
        extra += ["--lifetime", args.lifetime, "--lifetime-stagger", "5s"]
    knobs = {"margin": args.margin, "poll-interval": "5s", "replace-ahead": args.replace_ahead}
    dask.config.set({f"dasktune.cluster.walltime.{k}": v for k, v in knobs.items()})
    for k, v in knobs.items():  # the cluster file's head process reads them too
        os.environ[f"DASK_DASKTUNE__CLUSTER__WALLTIME__{k.upper().replace('-', '_')}"] = v
    if args.via == "adapt":
        from dask_jobqueue import SLURMCluster

        cluster = SLURMCluster(
            cores=1, memory="1GB", processes=1, walltime=args.walltime,
            worker_extra_args=["--resources", "CPU=1", *extra],
            log_directory=os.path.join(out, "logs"), job_name="dasktune-bench",
            scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"})
        cluster.adapt(minimum=args.minimum, maximum=args.maximum)
        address = cluster.scheduler_address
    else:
        from dasktune.cluster import get_provider, parse_cluster_config

        os.environ["XDG_CONFIG_HOME"] = os.path.join(out, "config")
        cluster = get_provider(parse_cluster_config({
            "cluster_name": "dasktune-bench", "provider": {"type": "slurm"},
            "min_workers": args.minimum, "max_workers": args.maximum,
            "head_node_type": "head", "available_node_types": {
                "head": {}, "workers": {"node_config": {
                    "cores": 1, "memory": "1GB", "walltime": args.walltime,
                    "worker_extra_args": extra}}}}))
        address = cluster.up(timeout=300)["scheduler_address"]
    client = tune.init(address=address)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                n = len(client.scheduler_info(n_workers=-1)["workers"])
            except Exception:  # noqa: BLE001 - shutting down
                return
            samples.append((time.time(), n))
            done.wait(0.5)

    threading.Thread(target=sample, daemon=True).start()
    trainable = ClassTrainable if args.trainable == "class" else function_trainable
    t0 = time.time()
    tuner = tune.Tuner(
        trainable,
        param_space={"iters": args.iters, "sleep": args.sleep, "k": args.k,
                     "x": tune.grid_search(list(range(args.trials)))},
        run_config=tune.RunConfig(
            storage_path=os.path.join(out, "results"), name="exp", verbose=0,
            stop={"training_iteration": args.iters},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0)),
    )
    grid = tuner.fit()
    wall = time.time() - t0
    done.set()
    errors = sum(r.error is not None for r in grid)
    tune.shutdown()
    if args.via == "adapt":
        cluster.close()
        errors_logged = logged_errors(os.path.join(out, "logs"))
    else:
        shutil.copytree(cluster.state.dir / "jobs", os.path.join(out, "logs"))  # down drops it
        errors_logged = logged_errors(os.path.join(out, "logs"))
        cluster.down()
    stats = analyse(os.path.join(out, "results", "exp"), args.iters, args.sleep)
    alive = [(t, n) for t, n in samples if n > 0]
    capacity = sum(n * (t1 - t0_) for (t0_, n), (t1, _) in zip(alive, alive[1:]))
    left = subprocess.run(["squeue", "-h", "-n", "dasktune-bench", "-o", "%i"],
                          capture_output=True, text=True).stdout.split()
    lost = stats["iterations_lost"]
    pauses = stats["pauses_s"]
    print(json.dumps({
        "via": args.via, "trainable": args.trainable, "lifetime": args.lifetime, "margin": args.margin,
        "walltime": args.walltime, "trials": args.trials, "errors": errors,
        "complete_trials": stats["complete_trials"], "wall_s": round(wall, 1),
        "moves": stats["moves"], "iterations_lost_per_move":
            round(statistics.mean(lost), 2) if lost else 0.0,
        "iterations_lost": lost, "pause_per_move_s": {
            "median": round(statistics.median(pauses), 2) if pauses else None,
            "max": max(pauses) if pauses else None},
        "idle_share": round(1 - stats["busy_s"] / capacity, 3) if capacity else None,
        "errors_logged_by_workers": errors_logged,
        "jobs_left_in_squeue": left, "out": out}, indent=1))


if __name__ == "__main__":
    main()
