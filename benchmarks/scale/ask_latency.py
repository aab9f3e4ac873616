"""Search at scale: Optuna TPE suggest latency with 1k and 10k finished trials.

The history is filled with ``OptunaSearch.add_evaluated_point`` (random points, a known
objective), then ``suggest`` + ``on_trial_complete`` is timed for a window of trials at
each size, through :class:`dasktune.search.optuna.OptunaSearch` as the driver calls it.
Then the same searcher is driven the way the driver loop drives it, through
:class:`~dasktune.search.SearchGenerator`: once one ``suggest`` was slower than
``dasktune.search.async-after`` (50 ms), asks run on the searcher's own thread, and
``loop_block_ms_max`` (the longest the loop waited in ``next_trial``, first ask
excluded) shows that the loop is no longer held by the sampler.

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
from dasktune.search import SearchGenerator  # noqa: E402
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
        block, done = _driven(search, asks, done)
        emit({"finished_trials": size, "asks": asks, "ask_ms_median": 1000 * statistics.median(lat),
              "ask_ms_max": 1000 * max(lat), "loop_block_ms_max": 1000 * block, "fill_s": fill})


def _driven(search: OptunaSearch, asks: int, done: int) -> tuple[float, int]:
    """Longest ``next_trial`` call over ``asks`` suggestions (the first one excluded)."""
    gen = SearchGenerator(search, -1)
    longest = 0.0
    for i in range(asks + 1):
        while True:
            t = time.perf_counter()
            s = gen.next_trial()
            if i:
                longest = max(longest, time.perf_counter() - t)
            if s is not None:
                break
            time.sleep(0.001)  # the loop's other work would go here
        gen.on_trial_complete(s.trial_id, {"loss": objective(s.config)})
        done += 1
    gen.close()
    return longest, done


if __name__ == "__main__":
    main()
