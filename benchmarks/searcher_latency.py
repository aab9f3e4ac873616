"""Suggest latency of each library searcher: through dasktune vs the library asked directly.

For each library the same run times two loops of N sequential trials on the same space
(4 uniform floats, a quadratic): the library's own ask/tell loop, and dasktune's searcher
driven as the driver drives it (``SearchGenerator.next_trial`` then ``on_trial_complete``).
The loops run side by side, trial i of one right after trial i of the other, so both see the
same machine load and the same number of past results. It prints the mean and median
milliseconds per trial (ask + tell) of each, and dasktune's overhead: the median of the
paired differences (robust to other jobs' load on a shared machine) and the difference of the
means. Target: dasktune adds <= 1 ms per suggestion.

    python benchmarks/searcher_latency.py                 # 60 trials each (HEBO, Ax: 20)
    python benchmarks/searcher_latency.py --smoke-test    # 10 trials each
    python benchmarks/searcher_latency.py --only hyperopt --only nevergrad -n 200
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from dasktune import space as sp
from dasktune.search import SearchGenerator

NAMES = ["x0", "x1", "x2", "x3"]
SPACE = {n: sp.uniform(-2.0, 2.0) for n in NAMES}


def loss(params: dict) -> float:
    return float(sum((float(params[n]) - 0.5) ** 2 for n in NAMES))


def paired(direct: Callable[[], None], ours: Callable[[], None], n: int
           ) -> tuple[list[float], list[float]]:
    """Seconds per trial of each loop, trial i of one right after trial i of the other
    (which goes first alternates), so both see the same load and the same history size."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(n):
        order = ((0, direct), (1, ours)) if i % 2 == 0 else ((1, ours), (0, direct))
        for which, step in order:
            start = time.perf_counter()
            step()
            times[which].append(time.perf_counter() - start)
    return times


# -- each library asked directly ------------------------------------------------------


def direct_hyperopt(n: int) -> Callable[[], None]:
    import hyperopt
    from hyperopt import hp

    space = {k: hp.uniform(k, -2.0, 2.0) for k in NAMES}
    domain = hyperopt.Domain(lambda c: c, space)
    trials = hyperopt.Trials()
    rng = np.random.default_rng(0)

    def step() -> None:
        ids = trials.new_trial_ids(1)
        docs = hyperopt.tpe.suggest(ids, domain, trials, int(rng.integers(2**31 - 1)))
        trials.insert_trial_docs(docs)
        trials.refresh()
        params = hyperopt.space_eval(space, hyperopt.base.spec_from_misc(docs[0]["misc"]))
        doc = trials._dynamic_trials[-1]
        doc["state"] = hyperopt.JOB_STATE_DONE
        doc["result"] = {"loss": loss(params), "status": hyperopt.STATUS_OK}
        trials.refresh()

    return step


def direct_nevergrad(n: int) -> Callable[[], None]:
    import nevergrad as ng

    opt = ng.optimizers.OnePlusOne(ng.p.Dict(**{k: ng.p.Scalar(lower=-2, upper=2)
                                                for k in NAMES}))

    def step() -> None:
        cand = opt.ask()
        opt.tell(cand, loss(cand.value))

    return step


def direct_bayesopt(n: int) -> Callable[[], None]:
    import bayes_opt

    opt = bayes_opt.BayesianOptimization(f=None, pbounds={k: (-2.0, 2.0) for k in NAMES},
                                         random_state=0, verbose=0, allow_duplicate_points=True)
    utility = bayes_opt.UtilityFunction(kind="ucb", kappa=2.576, xi=0.0)

    def step() -> None:
        params = opt.suggest(utility)
        opt.register(params=params, target=-loss(params))

    return step


def direct_bohb(n: int) -> Callable[[], None]:
    import ConfigSpace
    from hpbandster.optimizers.config_generators.bohb import BOHB

    from dasktune.search.bohb import TuneBOHB

    cs = TuneBOHB.convert_search_space(SPACE)
    assert isinstance(cs, ConfigSpace.ConfigurationSpace)
    cs.seed(0)
    gen = BOHB(cs)

    class Job:
        def __init__(self, value: float, config: dict) -> None:
            self.result, self.kwargs, self.exception = {"loss": value}, \
                {"budget": 1, "config": config}, None

    def step() -> None:
        config, _ = gen.get_config(None)
        gen.new_result(Job(loss(config), config))

    return step


def direct_zoopt(n: int) -> Callable[[], None]:
    import zoopt
    from zoopt.algos.opt_algorithms.racos.sracos import SRacosTune

    dim = zoopt.Dimension2([(zoopt.ValueType.CONTINUOUS, [-2.0, 2.0], 1e-12)] * len(NAMES))
    opt = SRacosTune(dimension=dim, parameter=zoopt.Parameter(budget=n + 10), parallel_num=1)

    def step() -> None:
        solution = opt.suggest()
        if solution is None:  # reopened after its initial samples (see ZOOptSearch)
            opt.semaphore = 1
            solution = opt.suggest()
        opt.complete(solution, loss(dict(zip(NAMES, solution.get_x()))))

    return step


def direct_hebo(n: int) -> Callable[[], None]:
    import pandas as pd
    from hebo.optimizers.hebo import HEBO

    from dasktune.search.hebo import HEBOSearch

    opt = HEBO(space=HEBOSearch.convert_search_space(SPACE))

    def step() -> None:
        frame = opt.suggest(n_suggestions=1)
        opt.observe(frame, np.array([[loss(frame.iloc[0].to_dict())]]))

    del pd
    return step


def direct_ax(n: int) -> Callable[[], None]:
    from ax import Client, RangeParameterConfig

    client = Client(random_seed=0)
    client.configure_experiment(parameters=[
        RangeParameterConfig(name=k, bounds=(-2.0, 2.0), parameter_type="float") for k in NAMES])
    client.configure_optimization(objective="-loss")
    client.configure_generation_strategy(method="random_search")

    def step() -> None:
        [(index, params)] = client.get_next_trials(max_trials=1).items()
        client.complete_trial(trial_index=index, raw_data={"loss": loss(params)})

    return step


# -- the same through dasktune ------------------------------------------------------------


def searcher(name: str):
    if name == "hyperopt":
        from dasktune.search.hyperopt import HyperOptSearch
        return HyperOptSearch(random_state_seed=0)
    if name == "nevergrad":
        import nevergrad as ng

        from dasktune.search.nevergrad import NevergradSearch
        return NevergradSearch(ng.optimizers.OnePlusOne)
    if name == "bayesopt":
        from dasktune.search.bayesopt import BayesOptSearch
        return BayesOptSearch(random_search_steps=0, skip_duplicate=False, patience=10**6)
    if name == "bohb":
        from dasktune.search.bohb import TuneBOHB
        return TuneBOHB(seed=0)
    if name == "zoopt":
        from dasktune.search.zoopt import ZOOptSearch
        return ZOOptSearch(budget=10**6)
    if name == "hebo":
        from dasktune.search.hebo import HEBOSearch
        return HEBOSearch(max_concurrent=1)
    from dasktune.search.ax import AxSearch
    return AxSearch(random_seed=0, method="random_search")


def through_dasktune(name: str, n: int) -> Callable[[], None]:
    gen = SearchGenerator(searcher(name), n)
    gen.set_search_properties("loss", "min", SPACE)
    gen.asks_inline = True  # time each ask on this thread, as the fast path runs it

    def step() -> None:
        s = gen.next_trial()
        assert s is not None
        result = {"loss": loss(s.config), "training_iteration": 1,
                  "hyperband_info": {"budget": 1}}
        gen.on_trial_result(s.trial_id, result)
        gen.on_trial_complete(s.trial_id, result)

    return step


DIRECT = {"hyperopt": direct_hyperopt, "nevergrad": direct_nevergrad,
          "bayesopt": direct_bayesopt, "bohb": direct_bohb, "zoopt": direct_zoopt,
          "hebo": direct_hebo, "ax": direct_ax}
SLOW = {"hebo", "ax"}  # seconds (HEBO) or tens of ms (Ax) per ask: fewer trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60, help="trials per loop")
    parser.add_argument("--smoke-test", action="store_true")
    parser.add_argument("--only", action="append", choices=list(DIRECT))
    args = parser.parse_args()
    n = 10 if args.smoke_test else args.n
    print(f"{'library':10} {'n':>4} {'direct mean':>12} {'dasktune mean':>14} "
          f"{'direct med':>11} {'dasktune med':>13} {'paired diff':>12} {'mean diff':>10}"
          "  (ms per trial)")
    for name in args.only or list(DIRECT):
        trials = min(n, 20) if name in SLOW and not args.only else n
        try:
            direct, ours = paired(DIRECT[name](trials), through_dasktune(name, trials), trials)
        except ImportError as exc:
            print(f"{name:10} skipped: {exc}")
            continue
        ms = [1e3 * statistics.mean(direct), 1e3 * statistics.mean(ours),
              1e3 * statistics.median(direct), 1e3 * statistics.median(ours)]
        diff = 1e3 * statistics.median(o - d for o, d in zip(ours, direct))
        print(f"{name:10} {trials:4d} {ms[0]:12.3f} {ms[1]:14.3f} {ms[2]:11.3f} {ms[3]:13.3f} "
              f"{diff:+12.3f} {ms[1] - ms[0]:+10.3f}", flush=True)

if __name__ == "__main__":
    main()
