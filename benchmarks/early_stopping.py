"""Early stopping and PBT on synthetic problems whose answer is known.

Part 1 (ASHA, HyperBand vs FIFO): ``--configs`` synthetic learning curves
``score(t) = final * (1 - exp(-t / tau)) + N(0, 0.002**2)``, ``final`` evenly spaced in
[0.5, 1.0], ``tau = max_t * (0.05 + 0.15 * (1 - q) + 0.1 * u)`` where ``q`` is the config's
final-rank quantile and ``u ~ U[0, 1]`` (better configs tend to learn faster, but curves do
cross). The noise is fixed per (config, iteration), so every scheduler sees the same curves,
and the true best (highest noise-free ``score(max_t)``) is computed beforehand. Every config
runs under FIFO, ``ASHAScheduler(grace_period=3,
reduction_factor=3)`` and ``HyperBandScheduler(reduction_factor=3)``, all with
``max_t`` iterations and 4 in flight. Checked: the best result (``scope="last"``) is FIFO's
and the true best config, and the scheduler spent <= 35% of FIFO's iterations (sum over
trials of the last ``training_iteration`` in ``ResultGrid.get_dataframe()``).

Part 2 (PBT vs random search): the toy of the PBT paper, ``Q(theta) = 1.2 - |theta|**2`` with
``theta`` in R^2 from (3, 3) (the paper starts at 0.9; farther makes the schedule matter
more), trained by noisy surrogate-gradient steps ``theta -= h * (2 * theta + N(0, 3**2))``:
a large step size ``h`` gains fast and a small one reaches higher (the noise floor is about
``h * 9 / 2``), so the best ``h`` shrinks over training (schedule-dependent). The noise is
sized so the schedule matters: in expectation (exact moment recursion, 200 steps) the best
fixed ``h`` ends at Q = 1.149 and a decaying schedule at 1.170; with N(0, 1) the two are
1.193 and 1.197, within one run's noise. A population of
``--population`` trials with ``h ~ loguniform(1e-3, 0.5)`` trains ``--steps`` iterations under
``PopulationBasedTraining(perturbation_interval=10)`` (checkpoints through
``tune.Checkpoint.from_directory`` / ``tune.get_checkpoint``) and, for the same total
iterations, as plain random search (FIFO). Both start from the same population
(``BasicVariantGenerator(random_state=seed)``), so a seed compares PBT with the very
members it started from. Checked: PBT's best final Q beats random search's, per seed.

``--framework ray`` runs the same code under Ray Tune (Ray's modules, same names and
arguments; ``pip install 'dasktune[bench]'``), for Ray's figures on the same problems.

    python benchmarks/early_stopping.py                # 81 curves, max_t 81; PBT 3 seeds
    python benchmarks/early_stopping.py --smoke-test   # 81 curves, max_t 27; PBT 1 seed
    python benchmarks/early_stopping.py --part pbt --seeds 5
    python benchmarks/early_stopping.py --framework ray  # the same, under Ray Tune
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale"))
from _common import no_loggers  # noqa: E402

import dasktune as tune  # noqa: E402
from dasktune.schedulers import (  # noqa: E402
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    PopulationBasedTraining,
)
from dasktune.search import BasicVariantGenerator  # noqa: E402

FRAMEWORK = "dasktune"


def use_ray() -> None:
    """Run everything below under Ray Tune instead: the same code, Ray's modules (the
    names and arguments are Ray's). Ray keeps its file loggers: its ResultGrid reads its
    dataframes from their files."""
    global FRAMEWORK, tune, ASHAScheduler, FIFOScheduler, HyperBandScheduler
    global PopulationBasedTraining, BasicVariantGenerator
    from ray import tune as ray_tune
    from ray.tune import schedulers, search

    FRAMEWORK, tune = "ray", ray_tune
    ASHAScheduler, FIFOScheduler = schedulers.ASHAScheduler, schedulers.FIFOScheduler
    HyperBandScheduler = schedulers.HyperBandScheduler
    PopulationBasedTraining = schedulers.PopulationBasedTraining
    BasicVariantGenerator = search.BasicVariantGenerator


def callbacks() -> list:
    return no_loggers() if FRAMEWORK == "dasktune" else []

IN_FLIGHT = 4
BUDGET = 0.35  # early stoppers must spend at most this share of FIFO's iterations
GRAD_NOISE = 3.0  # PBT toy's surrogate-gradient noise; large enough that h's schedule matters


def make_curves(n: int, max_t: int, seed: int = 0) -> tuple[list[dict[str, float]], int]:
    """``n`` curves (config ``cid`` has the cid-th largest final) and the true best cid."""
    rng = np.random.default_rng(seed)
    finals = np.linspace(1.0, 0.5, n)
    q = np.linspace(1.0, 0.0, n)
    taus = max_t * (0.05 + 0.15 * (1 - q) + 0.1 * rng.uniform(size=n))
    best = int(np.argmax(finals * (1 - np.exp(-max_t / taus))))
    order = rng.permutation(n)  # trials start in random order, not best first
    curves = [{"cid": int(i), "final": float(finals[i]), "tau": float(taus[i])} for i in order]
    return curves, best


def curve_trainable(config: dict) -> None:
    """Reports ``score`` per iteration; checkpoints each step so HyperBand can pause it."""
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["t"]
    c = config["curve"]
    for t in range(start + 1, config["max_t"] + 1):
        noise = 0.002 * np.random.default_rng([c["cid"], t]).standard_normal()
        score = c["final"] * (1 - math.exp(-t / c["tau"])) + noise
        if config["checkpoint"]:
            # report() returns once the checkpoint is committed, so the temp dir can go.
            with tempfile.TemporaryDirectory(prefix="curve-") as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"t": t}, f)
                tune.report({"score": score, "t": t},
                            checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report({"score": score, "t": t})


def run_curves(name: str, scheduler: object, curves: list[dict], max_t: int, storage: str
               ) -> dict[str, float]:
    t0 = time.perf_counter()
    grid = tune.Tuner(
        curve_trainable,
        param_space={"curve": tune.grid_search(curves), "max_t": max_t,
                     "checkpoint": name == "hyperband"},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=scheduler,
                                    max_concurrent_trials=IN_FLIGHT),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                  callbacks=callbacks()),
    ).fit()
    df = grid.get_dataframe()
    best = grid.get_best_result(metric="score", mode="max", scope="last")
    return {"iterations": int(df["training_iteration"].sum()), "steps": int(df["t"].sum()),
            "best_cid": int(best.config["curve"]["cid"]), "best_score": best.metrics["score"],
            "errors": grid.num_errors, "seconds": time.perf_counter() - t0}


def part_curves(n: int, max_t: int, storage: str) -> bool:
    curves, true_best = make_curves(n, max_t)
    schedulers = {
        "fifo": FIFOScheduler(),
        "asha": ASHAScheduler(max_t=max_t, grace_period=3, reduction_factor=3),
        "hyperband": HyperBandScheduler(max_t=max_t, reduction_factor=3),
    }
    rows = {name: run_curves(name, s, curves, max_t, storage) for name, s in schedulers.items()}
    fifo = rows["fifo"]["iterations"]
    ok = True
    print(f"\n== curves: {n} configs, max_t {max_t}, {IN_FLIGHT} in flight "
          f"(true best: cid {true_best})")
    for name, r in rows.items():
        share = r["iterations"] / fifo
        passed = r["best_cid"] == rows["fifo"]["best_cid"] == true_best and (
            name == "fifo" or share <= BUDGET) and not r["errors"]
        ok &= passed
        print(f"  {name:9} best cid {r['best_cid']:3} (score {r['best_score']:.4f}), "
              f"{r['iterations']:6} iterations ({share:6.1%} of FIFO; own step count "
              f"{r['steps']}), {r['errors']} errors, {r['seconds']:.1f}s  "
              f"{'ok' if passed else 'FAIL'}")
    return ok


def pbt_trainable(config: dict) -> None:
    """The PBT paper's toy: noisy surrogate-gradient ascent on ``Q = 1.2 - |theta|^2``."""
    theta, step = np.array([3.0, 3.0]), 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        theta, step = np.array(state["theta"]), state["step"]
    # Noise from (trial seed, step): restored trials continue a reproducible stream.
    rng = np.random.default_rng([config["seed"], step, int(config["h"] * 1e9)])
    while step < config["steps"]:
        step += 1
        theta = theta - config["h"] * (2 * theta + GRAD_NOISE * rng.standard_normal(2))
        q = float(1.2 - np.sum(theta**2))
        if step % config["interval"] == 0:
            with tempfile.TemporaryDirectory(prefix="pbt-") as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"theta": theta.tolist(), "step": step}, f)
                tune.report({"q": q, "step": step},
                            checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report({"q": q, "step": step})


def run_pbt(seed: int, population: int, steps: int, pbt: bool, storage: str
            ) -> dict[str, float]:
    interval = 10
    space = {"h": tune.loguniform(1e-3, 0.5), "seed": seed, "steps": steps,
             "interval": interval}
    if FRAMEWORK == "ray":  # Ray's PBT draws from the global RNG; it has no seed argument
        random.seed(seed)
    seeded = {"seed": seed} if FRAMEWORK == "dasktune" else {}
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=interval,
        hyperparam_mutations={"h": tune.loguniform(1e-3, 0.5)}, **seeded,
    ) if pbt else FIFOScheduler()
    t0 = time.perf_counter()
    grid = tune.Tuner(
        pbt_trainable, param_space=space,
        # The same seeded search for both: PBT starts from random search's population.
        tune_config=tune.TuneConfig(metric="q", mode="max", scheduler=scheduler,
                                    search_alg=BasicVariantGenerator(random_state=seed),
                                    num_samples=population, max_concurrent_trials=population),
        run_config=tune.RunConfig(name=f"{'pbt' if pbt else 'random'}-{seed}",
                                  storage_path=storage, verbose=0, callbacks=callbacks()),
    ).fit()
    df = grid.get_dataframe()
    best = grid.get_best_result(metric="q", mode="max", scope="last")
    return {"best_q": best.metrics["q"], "iterations": int(df["training_iteration"].sum()),
            "errors": grid.num_errors, "seconds": time.perf_counter() - t0}


def part_pbt(seeds: int, population: int, steps: int, storage: str, first_seed: int = 0
             ) -> bool:
    ok = True
    print(f"\n== PBT toy: population {population}, {steps} steps each; best final Q "
          "(optimum 1.2)")
    for seed in range(first_seed, first_seed + seeds):
        p = run_pbt(seed, population, steps, True, storage)
        r = run_pbt(seed, population, steps, False, storage)
        passed = p["best_q"] > r["best_q"] and not (p["errors"] or r["errors"])
        ok &= passed
        print(f"  seed {seed}: PBT {p['best_q']:.4f} ({p['iterations']} iterations, "
              f"{p['seconds']:.1f}s), random {r['best_q']:.4f} ({r['iterations']} iterations, "
              f"{r['seconds']:.1f}s), {p['errors'] + r['errors']} errors  "
              f"{'ok' if passed else 'FAIL'}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("curves", "pbt"), action="append")
    parser.add_argument("--configs", type=int, default=81)
    parser.add_argument("--max-t", type=int, default=81)
    parser.add_argument("--seeds", type=int, default=3, help="PBT seeds")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="PBT seeds run are first-seed .. first-seed + seeds - 1")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="PBT iterations per member")
    parser.add_argument("--smoke-test", action="store_true",
                        help="81 curves to max_t 27; PBT 1 seed (its full 200 steps: a "
                             "shorter run is too short for h's schedule to matter)")
    parser.add_argument("--framework", choices=("dasktune", "ray"), default="dasktune",
                        help="run the same benchmark under Ray Tune (pip install "
                             "'dasktune[bench]'), for its figures beside dasktune's")
    args = parser.parse_args()
    if args.smoke_test:
        args.configs, args.max_t, args.seeds = 81, 27, 1
    logging.getLogger("dasktune").setLevel(logging.WARNING)
    if args.framework == "ray":
        import ray

        use_ray()
        ray.init(num_cpus=IN_FLIGHT, include_dashboard=False, log_to_driver=False)
        shutdown = ray.shutdown
    else:
        tune.init(num_cpus=IN_FLIGHT)
        shutdown = tune.shutdown
    storage = tempfile.mkdtemp(prefix="bench-es-")
    ok = True
    t0 = time.perf_counter()
    try:
        parts = args.part or ["curves", "pbt"]
        if "curves" in parts:
            ok &= part_curves(args.configs, args.max_t, storage)
        if "pbt" in parts:
            ok &= part_pbt(args.seeds, args.population, args.steps, storage,
                           args.first_seed)
    finally:
        shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    print(f"\nverdict ({args.framework}): {'PASS' if ok else 'FAIL'} "
          f"({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
