"""OptunaSearch through the Searcher contract, with real Optuna samplers and storages."""

from __future__ import annotations

import copy
import importlib.util
import pickle
import time

import cloudpickle
import optuna
import pytest
from optuna.trial import TrialState

import dasktune as tune
from dasktune import space as sp
from dasktune.search import ConcurrencyLimiter, Repeater, SearchGenerator
from dasktune.search._base import Suggestion
from dasktune.search.optuna import InFlightTPESampler, OptunaSearch
from dasktune.search.optuna_space import to_optuna_distributions
from dasktune.search.testing import check_searcher
from dasktune.trial import ERROR, TERMINATED, Trial

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {"x": sp.uniform(-5, 5), "y": sp.uniform(-5, 5)}


def loss(config: dict) -> float:
    return (config["x"] - 1) ** 2 + (config["y"] + 2) ** 2


def _next_trial(gen: SearchGenerator) -> Suggestion | None:
    """``gen.next_trial()``, polled like the driver does while a slow searcher's suggestion
    is computed on its thread (``dasktune.search.async-after``)."""
    while (s := gen.next_trial()) is None and gen.asking:
        time.sleep(0.001)
    return s


def run_cycles(searcher, n_trials: int, in_flight: int, space=None, metric="loss", mode="min",
               objective=None, uid: str = "00000000") -> SearchGenerator:
    """Drive ``searcher`` like the driver loop does, with ``in_flight`` trials at once."""
    objective = objective or (lambda c: {"loss": loss(c)})
    gen = SearchGenerator(searcher, n_trials, experiment_uid=uid)
    gen.set_search_properties(metric, mode, space if space is not None else {})
    live = []
    while not gen.is_finished() or live:
        while len(live) < in_flight and (s := _next_trial(gen)) is not None:
            live.append(s)
        if not live:
            break
        done = live.pop(0)
        result = {**objective(done.config), "training_iteration": 1}
        gen.on_trial_result(done.trial_id, result)
        gen.on_trial_complete(done.trial_id, result)
    gen.get_state()  # waits for the calls queued on a slow searcher's thread
    gen.close()
    return gen


@pytest.mark.parametrize(
    "sampler",
    [
        None,  # TPE with constant liar
        optuna.samplers.RandomSampler(seed=0),
        pytest.param(
            "cmaes",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("cmaes") is None, reason="CmaEsSampler needs cmaes"
            ),
        ),
    ],
    ids=["tpe", "random", "cmaes"],
)
def test_single_objective_samplers_with_trials_in_flight(sampler):
    if sampler == "cmaes":
        sampler = optuna.samplers.CmaEsSampler(seed=0, n_startup_trials=3)
    searcher = OptunaSearch(sampler=sampler, seed=0 if sampler is None else None)
    run_cycles(searcher, n_trials=24, in_flight=4, space=SPACE)
    trials = searcher.study.trials
    assert len(trials) == 24 and all(t.state == TrialState.COMPLETE for t in trials)
    assert [t.number for t in trials] == list(range(24))
    assert all(-5 <= t.params["x"] <= 5 for t in trials)
    assert searcher.study.best_value < loss({"x": 0, "y": 0})  # it learned something
    assert all(1 in t.intermediate_values for t in trials)  # report(value, step=iteration)


def test_default_sampler_is_tpe_with_constant_liar():
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", seed=3)
    sampler = searcher.study.sampler
    assert isinstance(sampler, InFlightTPESampler) and repr(sampler).startswith(
        "InFlightTPESampler(seed=3,")
    # with one trial in flight it is Optuna's own seeded TPE (constant liar is its default)
    plain = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3, constant_liar=True))
    for i in range(14):  # past the 10 random startup trials
        config = searcher.suggest(f"t{i}")
        twin = plain.ask({"x": optuna.distributions.FloatDistribution(-5, 5),
                          "y": optuna.distributions.FloatDistribution(-5, 5)})
        assert config == twin.params
        searcher.on_trial_complete(f"t{i}", {"loss": loss(config)})
        plain.tell(twin, loss(config))
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", seed=3)
    twin = OptunaSearch(SPACE, metric="loss", mode="min", seed=3)
    assert twin.suggest("t0") == searcher.suggest("t0")  # seeded


def test_nsga2_multi_objective():
    searcher = OptunaSearch(
        SPACE, metric=["a", "b"], mode=["min", "max"],
        sampler=optuna.samplers.NSGAIISampler(seed=0, population_size=6),
    )
    run_cycles(searcher, 18, in_flight=3, metric=None, mode=None,
               objective=lambda c: {"a": c["x"] ** 2, "b": c["y"]})
    study = searcher.study
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE,
                                optuna.study.StudyDirection.MAXIMIZE]
    assert len(study.trials) == 18 and study.best_trials
    assert all(len(t.values) == 2 and not t.intermediate_values for t in study.trials)


def test_nested_space_constants_and_lists():
    space = {
        "model": {"lr": sp.loguniform(1e-4, 1e-1), "name": "mlp"},
        "layers": [sp.randint(1, 4), 16],
        "opt": sp.choice(["sgd", "adam"]),
        "q": sp.qrandint(0, 10, 5),
        "seed": 7,
    }
    searcher = OptunaSearch(space, metric="loss", mode="min", seed=0)
    config = searcher.suggest("t0")
    assert config["model"]["name"] == "mlp" and 1e-4 <= config["model"]["lr"] <= 1e-1
    assert config["layers"][1] == 16 and config["layers"][0] in (1, 2, 3)
    assert config["opt"] in ("sgd", "adam") and config["q"] in (0, 5, 10) and config["seed"] == 7
    assert set(searcher.study.trials[0].params) == {"model/lr", "layers/0", "opt", "q"}


def test_space_from_param_space_and_optuna_distribution_dict():
    gen = SearchGenerator(OptunaSearch(seed=0), 2)
    gen.set_search_properties("loss", "min", {"x": sp.uniform(0, 1), "c": "const"})
    first = _next_trial(gen)
    assert first.config["c"] == "const"
    assert first.experiment_tag == f"0_x={first.config['x']:.5g}"  # constants not tagged
    dists = {"a/b": optuna.distributions.FloatDistribution(0, 1),
             "k": optuna.distributions.CategoricalDistribution([1, 2])}
    searcher = OptunaSearch(dists, metric="loss", mode="max")
    gen = SearchGenerator(searcher, 1)
    gen.set_search_properties(None, None, {"const": 3})
    config = _next_trial(gen).config
    assert set(config) == {"a", "k", "const"} and 0 <= config["a"]["b"] <= 1


def test_define_by_run_conditional_space():
    def space(trial):
        kind = trial.suggest_categorical("kind", ["linear", "tree"])
        if kind == "tree":
            trial.suggest_int("depth", 1, 8)
        else:
            trial.suggest_float("alpha", 1e-3, 1.0, log=True)
        return {"fixed": "yes", "nested/key": 1}

    searcher = OptunaSearch(space, metric="score", mode="max", seed=1)

    def objective(c):
        return {"score": c.get("depth", 0) - c.get("alpha", 0)}

    run_cycles(searcher, 12, in_flight=3, metric=None, mode=None, objective=objective)
    trials = searcher.study.trials
    kinds = {t.params["kind"] for t in trials}
    assert kinds == {"linear", "tree"}
    for t in trials:
        assert ("depth" in t.params) == (t.params["kind"] == "tree")
    config = searcher.suggest("extra")
    assert config["fixed"] == "yes" and config["nested"] == {"key": 1}

    bad = OptunaSearch(lambda trial: [1], metric="m", mode="min")
    with pytest.raises(TypeError, match="None or a dict"):
        bad.suggest("t")


def test_complete_fail_pruned_and_intermediate():
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", seed=0)
    for tid in ("ok", "err", "stopped"):
        searcher.suggest(tid)
    searcher.on_trial_result("ok", {"loss": 3.0, "training_iteration": 1})
    searcher.on_trial_result("ok", {"loss": 2.0, "training_iteration": 2})
    searcher.on_trial_result("stopped", {"loss": 9.0, "training_iteration": 1})
    searcher.on_trial_complete("ok", {"loss": 2.0, "training_iteration": 2})
    searcher.on_trial_complete("err", None, error=True)
    searcher.on_trial_complete("stopped", {"loss": 9.0, "__early_stopped__": True})
    searcher.on_trial_complete("ok", {"loss": 1.0})  # a second completion is ignored
    searcher.suggest("silent")
    searcher.on_trial_complete("silent", {})  # no report at all: nothing to tell but FAIL
    ok, err, stopped, silent = searcher.study.trials
    assert silent.state == TrialState.FAIL
    assert ok.state == TrialState.COMPLETE and ok.value == 2.0
    assert ok.intermediate_values == {1: 3.0, 2: 2.0}
    assert err.state == TrialState.FAIL
    assert stopped.state == TrialState.PRUNED and stopped.value == 9.0


def test_metric_missing_and_other_errors():
    searcher = OptunaSearch(SPACE, metric="loss", mode="min")
    searcher.suggest("t")
    with pytest.raises(ValueError, match="metric 'loss' is not in the result of trial t"):
        searcher.on_trial_result("t", {"acc": 1, "training_iteration": 1})
    with pytest.raises(ValueError, match="'loss'"):
        searcher.on_trial_complete("t", {"acc": 1})
    with pytest.raises(ValueError, match="'g'.*grid_search.*GridSampler"):
        OptunaSearch({"g": sp.grid_search([1, 2])})
    gen = SearchGenerator(OptunaSearch(SPACE, metric="loss", mode="min"), 1)
    with pytest.raises(ValueError, match="already instantiated with a search space"):
        gen.set_search_properties("loss", "min", {"z": sp.uniform(0, 1)})
    with pytest.raises(ValueError, match="grid_search.*GridSampler"):
        SearchGenerator(OptunaSearch(), 1).set_search_properties(
            "loss", "min", {"g": sp.grid_search([1])}
        )
    with pytest.raises(RuntimeError, match="metric and mode"):
        OptunaSearch(SPACE).suggest("t")
    with pytest.raises(RuntimeError, match="no search space"):
        OptunaSearch(metric="m", mode="min").suggest("t")
    with pytest.raises(ValueError, match="no search space"):
        SearchGenerator(OptunaSearch(), 1).set_search_properties("m", "min", {"const": 1})
    with pytest.raises(ValueError, match="evaluated_rewards"):
        OptunaSearch(SPACE, evaluated_rewards=[1.0])


def test_grid_sampler_instead_of_grid_search():
    grid = optuna.samplers.GridSampler({"x": [-1.0, 0.0, 1.0], "y": [0.0]})
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", sampler=grid)
    gen = run_cycles(searcher, 10, in_flight=2)  # the grid ends the search after 3
    assert sorted(t.params["x"] for t in searcher.study.trials) == [-1.0, 0.0, 1.0]
    assert gen.is_finished()


def test_points_to_evaluate_and_evaluated_rewards():
    points = [{"x": 1.0, "y": -2.0}, {"x": 0.0, "y": 0.0}]
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", points_to_evaluate=points)
    assert searcher.suggest("a") == points[0] and searcher.suggest("b") == points[1]
    warm = OptunaSearch(SPACE, "loss", "min", points_to_evaluate=points,
                        evaluated_rewards=[0.0, 5.0])
    trials = warm.study.trials
    assert [t.value for t in trials] == [0.0, 5.0] and warm.study.best_params == points[0]
    with pytest.raises(ValueError, match="'z' not in the search space"):
        OptunaSearch(SPACE, "loss", "min", points_to_evaluate=[{"z": 1}]).suggest("t")
    with pytest.raises(TypeError, match="define-by-run"):
        OptunaSearch(lambda t: None, "loss", "min").add_evaluated_point({"x": 1}, 1.0)


def _half_then_restore(make_searcher, tmp_path):
    first = make_searcher()
    gen = SearchGenerator(first, 10, experiment_uid="aaaaaaaa")
    gen.set_search_properties("loss", "min", {})
    started = [_next_trial(gen) for _ in range(5)]
    for s in started[:3]:
        gen.on_trial_complete(s.trial_id, {"loss": loss(s.config)})
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(gen.get_state()))
    # a new process: build everything again, then restore
    second = make_searcher()
    gen2 = SearchGenerator(second, 10)
    gen2.set_search_properties("loss", "min", {})
    gen2.set_state(pickle.loads(path.read_bytes()))
    for s in started[3:]:  # trials in flight at save time finish after the restore
        gen2.on_trial_result(s.trial_id, {"loss": 1.0, "training_iteration": 1})
        gen2.on_trial_complete(s.trial_id, {"loss": loss(s.config)})
    rest = []
    while (s := _next_trial(gen2)) is not None:
        rest.append(s)
        gen2.on_trial_complete(s.trial_id, {"loss": loss(s.config)})
    assert gen2.is_finished() and len(rest) == 5
    assert [s.trial_id for s in rest] == [f"aaaaaaaa_{i:05d}" for i in range(5, 10)]
    trials = second.study.trials
    assert [t.number for t in trials] == list(range(10))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert 1 in trials[4].intermediate_values
    return second


def test_state_restore_in_memory(tmp_path):
    _half_then_restore(lambda: OptunaSearch(SPACE, seed=0), tmp_path)


def test_state_restore_with_journal_storage(tmp_path):
    journal = str(tmp_path / "study.log")
    searcher = _half_then_restore(
        lambda: OptunaSearch(SPACE, seed=0, storage=journal, study_name="exp"), tmp_path
    )
    assert searcher.study.study_name == "exp"
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(journal)
    )
    assert len(optuna.load_study(study_name="exp", storage=storage).trials) == 10


def test_state_restore_with_sqlite_and_save_to_dir(tmp_path):
    pytest.importorskip("sqlalchemy")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    searcher = OptunaSearch(SPACE, "loss", "min", storage=url, study_name="s")
    searcher.suggest("t0")
    searcher.on_trial_complete("t0", {"loss": 1.0})
    searcher.suggest("t1")
    searcher.save_to_dir(str(tmp_path / "ckpt"))
    again = OptunaSearch(SPACE, "loss", "min")
    again.restore_from_dir(str(tmp_path / "ckpt"))  # the URL travels in the state
    again.on_trial_complete("t1", {"loss": 0.5})
    again.suggest("t2")
    assert [t.number for t in again.study.trials] == [0, 1, 2]
    assert again.study.trials[1].value == 0.5


SAMPLERS_TO_PICKLE = {
    "default": (lambda: None, "loss", "min"),
    "tpe": (lambda: optuna.samplers.TPESampler(seed=0), "loss", "min"),
    # GA samplers hold a threading.Lock, which plain pickling refuses
    "nsga2": (lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=4),
              ["loss", "y"], ["min", "max"]),
}


@pytest.mark.parametrize("name", list(SAMPLERS_TO_PICKLE))
def test_get_state_set_state_continues_the_study(name):
    make_sampler, metric, mode = SAMPLERS_TO_PICKLE[name]

    def make() -> OptunaSearch:
        return OptunaSearch(SPACE, metric=metric, mode=mode, sampler=make_sampler())

    def result(config: dict) -> dict:
        return {"loss": loss(config), "y": config["y"], "training_iteration": 1}

    first = make()
    for i in range(5):
        first.on_trial_complete(f"t{i}", result(first.suggest(f"t{i}")))
    in_flight = first.suggest("t5")
    blob = pickle.dumps(first.get_state())  # what Searcher.save writes

    second = make()  # as in a new process
    second.set_state(pickle.loads(blob))
    second.on_trial_complete("t5", result(in_flight))  # in flight at save time
    for i in range(6, 10):
        second.on_trial_complete(f"t{i}", result(second.suggest(f"t{i}")))
    trials = second.study.trials
    assert [t.number for t in trials] == list(range(10))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert trials[5].params == {"x": in_flight["x"], "y": in_flight["y"]}
    assert len(first.study.trials) == 6  # the original study is untouched


@pytest.mark.parametrize("name", list(SAMPLERS_TO_PICKLE))
def test_searcher_pickles_and_deepcopies_with_any_sampler(name):
    make_sampler, metric, mode = SAMPLERS_TO_PICKLE[name]
    searcher = OptunaSearch(SPACE, metric=metric, mode=mode, sampler=make_sampler())
    searcher.on_trial_complete("t0", {"loss": 1.0, "y": 0.0} | searcher.suggest("t0"))
    searcher.suggest("t1")
    # the driver cloudpickles the TuneConfig (search_alg included) before the first trial
    config = tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, 2), num_samples=4)
    copied = cloudpickle.loads(cloudpickle.dumps(config)).search_alg.searcher
    for twin in (copied, copy.deepcopy(searcher), pickle.loads(pickle.dumps(searcher))):
        assert twin.study is not searcher.study and twin.study.sampler is not searcher._sampler
        twin.on_trial_complete("t1", {"loss": 0.5, "y": 1.0})  # in-flight trial still known
        twin.suggest("t2")
        assert [t.state for t in twin.study.trials] == [
            TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    assert len(searcher.study.trials) == 2


def test_add_evaluated_trials_from_an_earlier_experiment():
    earlier = [
        Trial("a", {"x": 1.0, "y": -2.0}, status=TERMINATED, last_result={"loss": 0.0}),
        Trial("b", {"x": 0.0, "y": 0.0}, status=ERROR),
    ]
    searcher = OptunaSearch(SPACE, metric="loss", mode="min", seed=0)
    searcher.add_evaluated_trials(earlier, "loss")
    done = searcher.study.trials
    assert [t.state for t in done] == [TrialState.COMPLETE, TrialState.FAIL]
    assert done[0].params == {"x": 1.0, "y": -2.0} and searcher.study.best_value == 0.0


def test_concurrency_limiter_around_optuna():
    searcher = ConcurrencyLimiter(OptunaSearch(SPACE, seed=0), max_concurrent=2)
    gen = SearchGenerator(searcher, 6)
    gen.set_search_properties("loss", "min", {})
    a, b = _next_trial(gen), _next_trial(gen)
    assert b is not None and _next_trial(gen) is None
    gen.on_trial_complete(a.trial_id, {"loss": loss(a.config)})
    assert _next_trial(gen) is not None
    assert len(searcher.searcher.study.trials) == 3


CONFORMANCE_SPACE = {
    "lr": sp.loguniform(1e-4, 1e-1),
    "q": sp.quniform(0, 1, 0.25),
    "n": sp.qrandint(2, 10, 2),
    "act": sp.choice(["relu", "tanh"]),
    "model": {"depth": sp.randint(1, 5), "name": "mlp"},
}


@pytest.mark.parametrize(
    "make",
    [
        lambda: OptunaSearch(seed=0),
        lambda: OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=1)),
        lambda: ConcurrencyLimiter(OptunaSearch(seed=0), max_concurrent=2),
        lambda: Repeater(OptunaSearch(seed=0), repeat=2),
    ],
    ids=["tpe", "random", "limited", "repeated"],
)
def test_conformance(make):
    made = check_searcher(make, CONFORMANCE_SPACE, n_trials=8, in_flight=3)
    assert len(made) == 8



_UNSEEN_AT_ASK: list[int] = []  # module level: the Tuner drives a copy of the searcher


class _RecordingSearch(OptunaSearch):
    """OptunaSearch that records, at each ask, how many study trials are asked but not told."""

    def suggest(self, trial_id: str) -> dict | None | str:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        _UNSEEN_AT_ASK.append(len(running))
        return super().suggest(trial_id)


def _quadratic_trainable(config: dict) -> None:
    tune.report({"loss": loss(config)})


def test_tuner_never_asks_ahead_of_free_slots(local_client, storage_path):
    # TPE learns from told trials only: the driver must ask only when a slot frees, after the
    # finished trial is told, so at most max_concurrent - 1 trials are unseen at each ask.
    _UNSEEN_AT_ASK.clear()
    results = tune.Tuner(
        _quadratic_trainable, param_space=dict(SPACE),
        tune_config=tune.TuneConfig(search_alg=_RecordingSearch(seed=0), metric="loss",
                                    mode="min", num_samples=12, max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=storage_path, name="ask-ahead", verbose=0),
    ).fit()
    assert not results.errors and len(results) == 12
    assert len(_UNSEEN_AT_ASK) == 12 and max(_UNSEEN_AT_ASK) <= 1, _UNSEEN_AT_ASK


# -- the translation of a param space (dasktune.search.optuna_space) ---------------------
def test_to_optuna_every_domain():
    od = optuna.distributions
    space = {
        "u": sp.uniform(0, 1),
        "qu": sp.quniform(0, 1, 0.25),
        "lu": sp.loguniform(1e-4, 1e-1),
        "ri": sp.randint(1, 10),
        "qri": sp.qrandint(1, 10, 3),
        "lri": sp.lograndint(1, 100),
        "qlri1": sp.qlograndint(1, 100, 1),
        "ch": sp.choice(["a", "b"]),
        "model": {"depth": sp.randint(2, 5), "name": "mlp"},
        "const": 7,
    }
    dists, constants = to_optuna_distributions(space)
    assert dists["u"] == od.FloatDistribution(0, 1)
    assert dists["qu"] == od.FloatDistribution(0, 1, step=0.25)
    assert dists["lu"] == od.FloatDistribution(1e-4, 1e-1, log=True)
    assert dists["ri"] == od.IntDistribution(1, 9)  # randint upper is exclusive
    assert dists["qri"] == od.IntDistribution(3, 9, step=3)  # same values as qrandint
    assert dists["lri"] == od.IntDistribution(1, 99, log=True)
    assert dists["qlri1"] == od.IntDistribution(1, 100, log=True)
    assert dists["ch"] == od.CategoricalDistribution(["a", "b"])
    assert dists["model/depth"] == od.IntDistribution(2, 4)
    assert constants == {"model/name": "mlp", "const": 7}
    with pytest.warns(UserWarning, match="q=0.1 is dropped"):
        dists, _ = to_optuna_distributions({"x": sp.qloguniform(0.1, 1, 0.1)})
    assert dists["x"] == od.FloatDistribution(0.1, 1, log=True)
    with pytest.warns(UserWarning, match="q=2 is dropped"):
        to_optuna_distributions({"x": sp.qlograndint(2, 100, 2)})
    kept, _ = to_optuna_distributions({"x": od.FloatDistribution(0, 2)})
    assert kept["x"] == od.FloatDistribution(0, 2)


def test_to_optuna_refusals():
    with pytest.raises(ValueError, match="'m/g'.*grid_search.*choice.*GridSampler"):
        to_optuna_distributions({"m": {"g": sp.grid_search([1, 2])}})
    with pytest.raises(ValueError, match="'f'.*sample_from.*define-by-run"):
        to_optuna_distributions({"f": sp.sample_from(lambda: 1)})
    with pytest.raises(ValueError, match="'n'.*normal"):
        to_optuna_distributions({"n": sp.randn()})
    with pytest.raises(ValueError, match="same name 'a/b'"):
        to_optuna_distributions({"a/b": sp.uniform(0, 1), "a": {"b": sp.uniform(0, 1)}})


def test_convert_search_space_is_rays_static_method():
    space = {"m": {"lr": sp.loguniform(1e-4, 1e-1)}, "k": sp.choice([1, 2]), "c": 3}
    dists = OptunaSearch.convert_search_space(space)  # no instance needed, as in Ray
    assert dists == {"m/lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
                     "k": optuna.distributions.CategoricalDistribution([1, 2])}
    with pytest.raises(ValueError, match="grid_search"):
        OptunaSearch.convert_search_space({"g": sp.grid_search([1, 2])})
