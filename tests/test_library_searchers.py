"""The library searchers (HyperOpt, Ax, BayesOpt, BOHB, Nevergrad, HEBO, ZOOpt) on a
shared bar, and each on its own behaviour.

The shared bar, for every searcher: the conformance kit (alone, and inside a Repeater around a
ConcurrencyLimiter), ``points_to_evaluate`` suggested first and in order, a saved and restored
searcher that continues the same search (not a new one), and the one-line ImportError naming
the pip extra. Then what each library is for: it beats random search on a small function with
a fixed seed, conditional spaces, constraints, evaluated rewards, batches.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from dasktune import space as sp
from dasktune import stopper as tune_stopper
from dasktune.search import ConcurrencyLimiter, Repeater, Searcher
from dasktune.search.testing import check_searcher

# Each searcher: its module, the library to skip on, a factory, and a space it can take.
FLOATS = {"x": sp.uniform(-2, 2), "nested": {"y": sp.uniform(-2, 2), "k": "const"}}
MIXED = {"x": sp.uniform(-2, 2), "nested": {"y": sp.uniform(-2, 2), "k": "const"},
         "n": sp.randint(1, 4), "act": sp.choice(["relu", "tanh"])}


def _hyperopt():
    from dasktune.search.hyperopt import HyperOptSearch
    return HyperOptSearch(random_state_seed=0, n_initial_points=5)


def _nevergrad():
    import nevergrad as ng

    from dasktune.search.nevergrad import NevergradSearch
    return NevergradSearch(ng.optimizers.OnePlusOne)


def _bayesopt():
    from dasktune.search.bayesopt import BayesOptSearch
    return BayesOptSearch(random_search_steps=4, random_state=0)


def _bohb():
    from dasktune.search.bohb import TuneBOHB
    return TuneBOHB(seed=0)


def _zoopt():
    from dasktune.search.zoopt import ZOOptSearch
    return ZOOptSearch(budget=20, parallel_num=2, seed=0)


def _hebo():
    from dasktune.search.hebo import HEBOSearch
    # its first 6 suggestions random: a GP fit and NSGA-II search take 10-40 s per batch on
    # a shared 2-core machine (the model's own test is marked slow)
    return HEBOSearch(random_state_seed=0, max_concurrent=4, rand_sample=6)


def _ax():
    from dasktune.search.ax import AxSearch
    # Sobol draws: BoTorch's model fits take minutes on a shared 2-core machine
    return AxSearch(random_seed=0, method="random_search")


SEARCHERS = {
    "hyperopt": ("hyperopt", _hyperopt, MIXED),
    "nevergrad": ("nevergrad", _nevergrad, MIXED),
    "bayesopt": ("bayes_opt", _bayesopt, FLOATS),
    "bohb": ("hpbandster", _bohb, MIXED),
    # ZOOpt ends its search (FINISHED) early when a small discrete part leaves it no new point
    "zoopt": ("zoopt", _zoopt, FLOATS),
    "hebo": ("hebo", _hebo, MIXED),
    "ax": ("ax", _ax, MIXED),
}
EXTRAS = {"hyperopt": "hyperopt", "nevergrad": "nevergrad", "bayesopt": "bayesopt",
          "bohb": "bohb", "zoopt": "zoopt", "hebo": "hebo", "ax": "ax"}
LIBRARY_MODULE = {"hyperopt": "hyperopt", "nevergrad": "nevergrad", "bayesopt": "bayes_opt",
                  "bohb": "hpbandster", "zoopt": "zoopt", "hebo": "hebo", "ax": "ax"}


def make(name: str):
    library, factory, space = SEARCHERS[name]
    pytest.importorskip(library)
    return factory, space


def quadratic(config: dict) -> float:
    return (config["x"] - 0.7) ** 2 + (config["nested"]["y"] + 0.4) ** 2


def drive(searcher: Searcher, n: int, objective=quadratic, ids: str = "t") -> list[dict]:
    """Ask and tell ``n`` trials one at a time; the configs, in order."""
    configs = []
    i = 0
    while len(configs) < n:
        assert i < 3 * n, f"{type(searcher).__name__} keeps saying 'not now' with nothing out"
        tid = f"{ids}{i}"
        i += 1
        config = searcher.suggest(tid)
        assert config != Searcher.FINISHED, f"finished after {len(configs)}"
        if config is None:
            continue
        configs.append(config)
        finish(searcher, tid, objective(config))
    return configs


def finish(searcher: Searcher, tid: str, loss: float) -> None:
    """The last result of a trial, then its completion (BOHB learns from the result at a
    HyperBand milestone, which HyperBandForBOHB marks)."""
    result = {"loss": loss, "training_iteration": 1, "hyperband_info": {"budget": 1}}
    searcher.on_trial_result(tid, result)
    searcher.on_trial_complete(tid, result)


def configured(name: str, space: dict | None = None):
    factory, default_space = make(name)
    searcher = factory()
    assert searcher.set_search_properties("loss", "min", space or default_space)
    return searcher


# -- the shared bar --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SEARCHERS))
def test_conformance(name):
    factory, space = make(name)
    made = check_searcher(factory, space, n_trials=8, in_flight=2)
    assert len(made) == 8 or name == "zoopt"  # ZOOpt ends (FINISHED) when it finds no new point
    assert all(m.config["nested"]["k"] == "const" for m in made)


@pytest.mark.parametrize("name", list(SEARCHERS))
def test_conformance_inside_repeater_and_concurrency_limiter(name):
    factory, space = make(name)
    made = check_searcher(lambda: Repeater(ConcurrencyLimiter(factory(), 2), repeat=2), space,
                          n_trials=6, in_flight=2)
    # the repeats of one suggestion share its config
    assert made[0].config["x"] == made[1].config["x"]
    assert [m.config["__trial_index__"] for m in made[:4]] == [0, 1, 0, 1]


@pytest.mark.parametrize("name", list(SEARCHERS))
def test_points_to_evaluate_come_first_in_order(name):
    library, factory, space = SEARCHERS[name]
    pytest.importorskip(library)
    points = [{"x": 0.5, "nested": {"y": -1.0}, "n": 2, "act": "tanh"},
              {"x": -1.5, "nested": {"y": 1.25}, "n": 3, "act": "relu"}]
    if space is FLOATS:
        points = [{"x": p["x"], "nested": p["nested"]} for p in points]
    searcher = factory()
    searcher._points = [dict(p) for p in points]  # as the constructor keeps them
    assert searcher.set_search_properties("loss", "min", space)
    got = [searcher.suggest(f"t{i}") for i in range(2)]
    for config, point in zip(got, points):
        assert config["x"] == pytest.approx(point["x"])
        assert config["nested"]["y"] == pytest.approx(point["nested"]["y"])
        assert config["nested"]["k"] == "const"
        for key in ("n", "act"):
            if key in point:
                assert config[key] == point[key]


def _observations(name: str, searcher) -> int:
    """How many results the library itself holds."""
    opt = searcher._opt
    if name == "hyperopt":
        return sum(t["result"].get("status") == "ok" for t in searcher._trials.trials)
    if name == "nevergrad":
        return opt.num_tell
    if name == "bayesopt":
        return len(opt.res) + len(searcher._buffered or [])
    if name == "bohb":
        return sum(len(v) for v in opt.configs.values())
    if name == "zoopt":
        return opt.complete_num
    if name == "hebo":
        return len(opt.y)
    return int((opt.summarize()["trial_status"] == "COMPLETED").sum())  # ax


@pytest.mark.parametrize("name", list(SEARCHERS))
def test_a_restored_searcher_continues_the_search(name, tmp_path):
    searcher = configured(name)
    drive(searcher, 6)
    in_flight = searcher.suggest("flight")
    assert in_flight is not None
    path = str(tmp_path / "state.pkl")
    searcher.save(path)
    fresh_next = configured(name).suggest("other")
    restored = configured(name)
    restored.restore(path)
    assert _observations(name, restored) == 6  # it knows what the search learned
    # the trial in flight at save time completes on the restored searcher
    finish(restored, "flight", quadratic(in_flight))
    assert _observations(name, restored) == 7
    finish(searcher, "flight", quadratic(in_flight))
    if name in ("hyperopt", "nevergrad", "bayesopt", "bohb", "ax"):  # seeded: same next step
        assert restored.suggest("next") == searcher.suggest("next")
    assert restored.suggest("next2") != fresh_next


@pytest.mark.parametrize("name", list(SEARCHERS))
def test_missing_library_is_a_one_line_import_error_naming_the_extra(name):
    code = (
        "import sys\n"
        f"sys.modules[{LIBRARY_MODULE[name]!r}] = None\n"
        "try:\n"
        f"    import dasktune.search.{name}\n"
        "except ImportError as exc:\n"
        "    print(str(exc))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120).stdout.strip()
    assert out.count("\n") == 0 and f'pip install "dasktune[{EXTRAS[name]}]"' in out, out


def test_metric_mode_and_space_come_from_the_tuner_or_the_constructor():
    pytest.importorskip("hyperopt")
    from dasktune.search.hyperopt import HyperOptSearch

    own = HyperOptSearch(FLOATS, metric="loss", mode="max")
    assert own.set_search_properties(None, None, {"k": 1})  # constants only: fine
    assert not own.set_search_properties(None, None, {"z": sp.uniform(0, 1)})
    assert not own.set_search_properties("other", None, {})
    bare = HyperOptSearch()
    with pytest.raises(RuntimeError, match="no search space"):
        bare.suggest("t0")
    assert bare.set_search_properties("acc", "max", FLOATS)
    assert bare.metric == "acc" and bare.mode == "max"
    with pytest.raises(ValueError, match="grid_search"):
        HyperOptSearch({"x": sp.grid_search([1, 2])})
    with pytest.raises(ValueError, match="one metric"):
        HyperOptSearch(metric=["a", "b"], mode=["min", "max"])


# -- each library's own behaviour ---------------------------------------------------------


def random_best(n: int, seeds: int = 11) -> float:
    """The median over seeds of random search's best loss in ``n`` trials on FLOATS."""
    bests = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        bests.append(min(quadratic({"x": rng.uniform(-2, 2), "nested": {"y": rng.uniform(-2, 2)}})
                         for _ in range(n)))
    return float(np.median(bests))


@pytest.mark.parametrize("name,n", [("hyperopt", 30), ("nevergrad", 30), ("bayesopt", 10),
                                    ("bohb", 30)])
def test_beats_random_search_on_a_quadratic(name, n):
    searcher = configured(name, FLOATS)
    configs = drive(searcher, n)
    best = min(quadratic(c) for c in configs)
    assert best < random_best(n), (best, random_best(n))


def test_zoopt_beats_random_search_and_its_seed_repeats_the_search():
    pytest.importorskip("zoopt")
    from dasktune.search.zoopt import ZOOptSearch

    def search(seed: int) -> list[dict]:
        searcher = ZOOptSearch(budget=30, seed=seed)
        searcher.set_search_properties("loss", "min", FLOATS)
        return drive(searcher, 30)

    # ZOOpt draws from numpy's global generator: the seed makes the run repeatable
    assert search(0) == search(0)
    bests = [min(quadratic(c) for c in search(seed)) for seed in range(5)]
    assert np.median(bests) < random_best(30), (bests, random_best(30))


@pytest.mark.slow
def test_hebo_beats_random_search_on_a_quadratic():
    # HEBO is not repeatable even seeded: its NSGA-II (pymoo) seeds itself from the OS.
    # 6 quasi-random draws, then 2 model batches of 6 (each batch costs seconds of
    # NSGA-II; 4 model draws were too few to be sure of beating random).
    pytest.importorskip("hebo")
    from dasktune.search.hebo import HEBOSearch

    searcher = HEBOSearch(random_state_seed=0, max_concurrent=6, rand_sample=6)
    searcher.set_search_properties("loss", "min", FLOATS)
    configs = drive(searcher, 18)
    best = min(quadratic(c) for c in configs)
    assert best < random_best(18), (best, random_best(18))


def test_maximizing_is_minimizing_the_negation():
    searcher = configured("nevergrad", FLOATS)
    searcher._mode = "max"
    configs = drive(searcher, 30, objective=lambda c: -quadratic(c))
    assert min(quadratic(c) for c in configs) < random_best(30)


def test_hyperopt_conditional_space_gives_one_branch_and_learns_it():
    pytest.importorskip("hyperopt")
    from dasktune.search.hyperopt import HyperOptSearch

    space = {"model": sp.choice([{"kind": "linear", "slope": sp.uniform(0, 1)},
                                 {"kind": "tree", "depth": sp.randint(1, 8),
                                  "leaf": {"min": sp.uniform(0, 1)}}]),
             "seed": 3}
    searcher = HyperOptSearch(space, "loss", "min", random_state_seed=1, n_initial_points=6,
                              points_to_evaluate=[{"model": {"kind": "tree", "depth": 2,
                                                              "leaf": {"min": 0.5}}}])
    first = searcher.suggest("p")
    assert first == {"model": {"kind": "tree", "depth": 2, "leaf": {"min": 0.5}}, "seed": 3}

    def loss(c):  # the tree branch with a small leaf is best
        m = c["model"]
        return 1 + m["slope"] if m["kind"] == "linear" else abs(m["leaf"]["min"] - 0.1)

    searcher.on_trial_complete("p", {"loss": loss(first)})
    configs = drive(searcher, 40, objective=loss)
    for c in configs:
        keys = {"kind", "slope"} if c["model"]["kind"] == "linear" else {"kind", "depth", "leaf"}
        assert set(c["model"]) == keys
    assert sum(c["model"]["kind"] == "tree" for c in configs[-15:]) >= 10  # random: 7.5
    with pytest.raises(ValueError, match="does not fit"):
        HyperOptSearch(space, "loss", "min", points_to_evaluate=[{"model": {"kind": "rnn"}}]
                       ).suggest("t")


def test_hyperopt_takes_its_own_space_form():
    pytest.importorskip("hyperopt")
    from hyperopt import hp

    from dasktune.search.hyperopt import HyperOptSearch

    space = {"act": hp.choice("act", [{"activation": "relu", "mult": hp.uniform("mult", 1, 2)},
                                      {"activation": "tanh"}]),
             "width": hp.uniform("width", 0, 20), "steps": 100}
    searcher = HyperOptSearch(space, "loss", "min", random_state_seed=0,
                              points_to_evaluate=[{"act": {"activation": "tanh"}, "width": 3}])
    assert searcher.suggest("t0") == {"act": {"activation": "tanh"}, "steps": 100, "width": 3}
    config = searcher.suggest("t1")
    assert 0 <= config["width"] <= 20 and config["steps"] == 100


def test_bayesopt_holds_back_random_results_and_stops_on_repeats():
    searcher = configured("bayesopt", FLOATS)  # 4 random steps
    for i in range(4):
        assert searcher.suggest(f"r{i}") is not None
    assert searcher.suggest("wait") is None  # the random results are not all in
    for i in range(4):
        searcher.on_trial_complete(f"r{i}", {"loss": 1.0 + i})
    assert len(searcher._opt.res) == 4 and searcher.suggest("gp") is not None
    from dasktune.search.bayesopt import BayesOptSearch

    repeat = BayesOptSearch(FLOATS, "loss", "min", patience=2, random_search_steps=1,
                            points_to_evaluate=[{"x": 1.0, "nested": {"y": 1.0}}] * 3)
    assert repeat.suggest("a") is not None
    assert repeat.suggest("b") is None  # a duplicate is skipped
    assert repeat.suggest("c") == Searcher.FINISHED  # suggested more than patience times
    with pytest.raises(ValueError, match="only tune.uniform"):
        BayesOptSearch({"n": sp.randint(0, 3)})


def test_hebo_evaluated_rewards_and_batches():
    pytest.importorskip("hebo")
    from dasktune.search.hebo import HEBOSearch

    points = [{"x": 0.0, "nested": {"y": 0.0}}, {"x": 1.0, "nested": {"y": -1.0}}]
    searcher = HEBOSearch(FLOATS, "loss", "min", points_to_evaluate=points,
                          evaluated_rewards=[quadratic(p) for p in points], random_state_seed=0,
                          max_concurrent=2, rand_sample=10)  # random draws: fast
    first = searcher.suggest("a")
    assert len(searcher._opt.y) == 2  # the rewards were observed, the points not run
    assert first not in points
    assert searcher.suggest("b") is not None
    assert searcher.suggest("c") is None  # the batch of 2 is out
    searcher.on_trial_complete("a", {"loss": 1.0})
    assert searcher.suggest("c") is None  # ... until all of it is back
    searcher.on_trial_complete("b", {"loss": 1.0})
    assert searcher.suggest("c") is not None
    limited = ConcurrencyLimiter(HEBOSearch(FLOATS, "loss", "min"), max_concurrent=3)
    assert limited.searcher._max_concurrent == 3  # HEBO batches by the limit itself


def test_ax_honours_constraints_and_reads_constraint_metrics():
    pytest.importorskip("ax")
    from dasktune.search.ax import AxSearch

    searcher = AxSearch(parameter_constraints=["x + z <= 1.0"],
                        outcome_constraints=["l2norm <= 1.25"], random_seed=0,
                        method="random_search")
    searcher.set_search_properties("loss", "max", {"x": sp.uniform(0, 1),
                                                   "z": sp.uniform(0, 1), "steps": 5})
    for i in range(8):
        config = searcher.suggest(f"t{i}")
        assert config["x"] + config["z"] <= 1.0 + 1e-9 and config["steps"] == 5
        searcher.on_trial_complete(f"t{i}", {"loss": config["x"], "l2norm": 1.0})
    data = searcher._opt.summarize()
    assert {"loss", "l2norm"} <= set(data.columns) and len(data) == 8
    searcher.suggest("bad")
    searcher.on_trial_complete("bad", None, error=True)
    assert (searcher._opt.summarize()["trial_status"] == "FAILED").sum() == 1


def test_ax_takes_its_old_parameter_dicts():
    pytest.importorskip("ax")
    from dasktune.search.ax import AxSearch

    searcher = AxSearch([{"name": "lr", "type": "range", "bounds": [1e-4, 1e-1],
                          "log_scale": True},
                         {"name": "opt", "type": "choice", "values": ["sgd", "adam"]},
                         {"name": "epochs", "type": "fixed", "value": 3}],
                        metric="acc", mode="max", random_seed=0, method="random_search",
                        points_to_evaluate=[{"lr": 0.01, "opt": "adam"}])
    assert searcher.suggest("t0") == {"lr": 0.01, "opt": "adam", "epochs": 3}
    config = searcher.suggest("t1")
    assert 1e-4 <= config["lr"] <= 1e-1 and config["opt"] in ("sgd", "adam")


def test_zoopt_says_finished_or_waits_but_never_repeats_ids():
    pytest.importorskip("zoopt")
    from dasktune.search.zoopt import ZOOptSearch

    searcher = ZOOptSearch(budget=6, dim_dict=FLOATS, metric="loss", mode="min",
                           points_to_evaluate=[{"x": 0.25, "nested": {"y": 0.5}}])
    first = searcher.suggest("t0")
    assert first["x"] == 0.25 and first["nested"] == {"y": 0.5, "k": "const"}
    with pytest.raises(ValueError, match="budget"):
        ZOOptSearch()
    dims = ZOOptSearch.convert_search_space(MIXED)
    assert dims["n"][1:] == ([1, 3], True) and dims["act"][1] == ["relu", "tanh"]
    assert dims["nested/y"][1] == [-2, 2] and "nested/k" not in dims


def test_nevergrad_takes_an_optimizer_instance_with_its_parametrization():
    ng = pytest.importorskip("nevergrad")
    from dasktune.search.nevergrad import NevergradSearch

    param = ng.p.Dict(lr=ng.p.Log(lower=1e-4, upper=1e-1), layers=ng.p.Choice([1, 2, 3]))
    searcher = NevergradSearch(ng.optimizers.TwoPointsDE(parametrization=param, budget=10),
                               metric="loss", mode="min")
    config = searcher.suggest("t0")
    assert 1e-4 <= config["lr"] <= 1e-1 and config["layers"] in (1, 2, 3)
    with pytest.raises(ValueError, match="own parametrization"):
        NevergradSearch(ng.optimizers.TwoPointsDE(parametrization=param), space=FLOATS)


def test_a_failed_or_nan_trial_does_not_count_as_a_result():
    searcher = configured("nevergrad", FLOATS)
    searcher.suggest("a")
    searcher.suggest("b")
    searcher.on_trial_complete("a", None, error=True)
    searcher.on_trial_complete("b", {"loss": math.nan})
    assert searcher._opt.num_tell == 0
    searcher.suggest("c")
    with pytest.raises(ValueError, match="'loss' is not in the result"):
        searcher.on_trial_complete("c", {"other": 1.0})


# -- Tuner.restore continues the search ---------------------------------------------------

class StopAllAfter(tune_stopper.Stopper):
    """Stops the whole experiment once ``n`` trials reported, while ``flag`` (a file) exists
    (a file, since the experiment pickles its stopper by value)."""

    def __init__(self, n: int, flag: str) -> None:
        self.n = n
        self.flag = flag
        self.seen: set[str] = set()

    def __call__(self, trial_id, result):
        self.seen.add(trial_id)
        return False

    def stop_all(self):
        return os.path.exists(self.flag) and len(self.seen) >= self.n


def report_quadratic(config):
    from dasktune import report
    report({"loss": quadratic(config)})


@pytest.mark.slow
def test_tuner_restore_continues_a_hyperopt_search(local_client, storage_path, tmp_path):
    """With more random start-up trials than trials, a seeded HyperOptSearch's k-th
    suggestion is its k-th draw: a continued search makes each of the first 8 draws once; a
    restarted one would make the first ones twice."""
    pytest.importorskip("hyperopt")
    import dasktune as tune
    from dasktune.search.hyperopt import HyperOptSearch

    def searcher():
        return HyperOptSearch(random_state_seed=7, n_initial_points=50)

    fresh = searcher()
    fresh.set_search_properties("loss", "min", FLOATS)
    draws = [fresh.suggest(f"f{i}") for i in range(8)]
    flag = tmp_path / "stop"
    flag.touch()
    results = tune.Tuner(
        report_quadratic, param_space=FLOATS,
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8,
                                    search_alg=searcher(), max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=storage_path, name="hyp", verbose=0,
                                  stop=StopAllAfter(3, str(flag))),
    ).fit()
    first = [r.config for r in results]
    assert 3 <= len(first) < 8
    flag.unlink()
    restored = tune.Tuner.restore(results.experiment_path, report_quadratic).fit()
    configs = sorted((r.config for r in restored), key=lambda c: c["x"])
    assert len(configs) == 8 and all(r.metrics.get("loss") is not None for r in restored)
    assert configs == sorted(draws, key=lambda c: c["x"])
