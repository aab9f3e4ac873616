"""Search at scale: Optuna TPE suggest latency with 1k and 10k finished trials.

The history is filled with ``OptunaSearch.add_evaluated_point`` (random points, a known
objective), then ``suggest`` + ``on_trial_complete`` is timed for a window of trials at
each size, through :class:`dasktune.search.optuna.OptunaSearch` as the driver calls it.
The driver calls ``suggest`` synchronously in its loop, so this latency is time in which
no report is processed and no slot is filled.

    python benchmarks/scale/ask_latency.py            # 1k and 10k, 20 asks each
    python benchmarks/scale/ask_latency.py --quick    # 1k and 10k, 5 asks each
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import optuna  # noqa: E402
from _common import emit  # noqa: E402

import dasktune as tune  # noqa: E402
from dasktune.search.optuna import OptunaSearch  # noqa: E402


def objective(cfg: dict) -> float:
    return (cfg["x"] - 0.3) ** 2 + (cfg["y"] + 0.2) ** 2 + 0.1 * cfg["z"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="1000,10000")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    asks = 5 if args.quick else 20
    space = {"x": tune.uniform(-1, 1), "y": tune.uniform(-1, 1), "z": tune.randint(0, 10)}
    search = OptunaSearch(seed=0)
    search.set_search_properties("loss", "min", space)
    rng = random.Random(0)
    done = 0
    for size in [int(s) for s in args.sizes.split(",")]:
        t = time.perf_counter()
        while done < size:
            p = {"x": rng.uniform(-1, 1), "y": rng.uniform(-1, 1), "z": rng.randrange(10)}
            search.add_evaluated_point(p, objective(p))
            done += 1
        fill = time.perf_counter() - t
        lat = []
        for i in range(asks):
            tid = f"t{size}_{i}"
            t = time.perf_counter()
            cfg = search.suggest(tid)
            lat.append(time.perf_counter() - t)
            search.on_trial_complete(tid, {"loss": objective(cfg)})
            done += 1
        emit({"finished_trials": size, "asks": asks, "ask_ms_median": 1000 * statistics.median(lat),
              "ask_ms_max": 1000 * max(lat), "fill_s": fill})


if __name__ == "__main__":
    main()
