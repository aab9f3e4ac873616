"""Search algorithms without Optuna: BasicVariantGenerator, SearchGenerator, the wrappers."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import pytest

from dasktune import space as sp
from dasktune.results import ResultGrid
from dasktune.search import (
    TRIAL_INDEX,
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Repeater,
    SearchAlgorithm,
    Searcher,
    SearchGenerator,
    Suggestion,
    create_searcher,
)
from dasktune.trial import ERROR, TERMINATED, Trial

UID = "0123abcd"


def drain(alg: SearchAlgorithm, limit: int = 1000) -> list[Suggestion]:
    out = []
    while len(out) < limit and (s := alg.next_trial()) is not None:
        out.append(s)
    return out


def bvg(space: dict, num_samples: int = 1, **kwargs) -> BasicVariantGenerator:
    alg = BasicVariantGenerator(**kwargs)
    alg.set_search_properties("loss", "min", space, num_samples=num_samples, experiment_uid=UID)
    return alg


class ListSearcher(Searcher):
    """Suggests the given configs in turn, then FINISHED; records what it was told."""

    def __init__(self, configs: list, metric: str | None = None, mode: str | None = None):
        super().__init__(metric, mode)
        self.configs = list(configs)
        self.completed: list = []
        self.results: list = []

    def suggest(self, trial_id):
        if not self.configs:
            return Searcher.FINISHED
        item = self.configs.pop(0)
        return None if item == "wait" else dict(item)

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append((trial_id, result, error))

    def get_state(self):
        return {"configs": self.configs, "completed": self.completed}

    def set_state(self, state):
        self.configs, self.completed = state["configs"], state["completed"]


def test_importing_search_does_not_import_optuna():
    code = "import sys, dasktune.search; assert 'optuna' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- BasicVariantGenerator ------------------------------------------------------------


def test_bvg_counts_order_ids_and_tags():
    space = {"lr": sp.uniform(0, 1), "layers": sp.grid_search([1, 2, 3]), "c": "k"}
    alg = bvg(space, num_samples=2, random_state=0)
    assert alg.total_samples == 6
    trials = drain(alg)
    assert alg.is_finished() and len(trials) == 6
    assert [t.config["layers"] for t in trials] == [1, 2, 3, 1, 2, 3]
    assert [t.trial_id for t in trials] == [f"{UID}_{i:05d}" for i in range(6)]
    assert len({t.config["lr"] for t in trials}) == 6  # random parts drawn afresh
    assert all(t.config["c"] == "k" for t in trials)
    lr = trials[3].config["lr"]
    assert trials[3].experiment_tag == f"3_layers=1,lr={lr:.5g}"


def test_bvg_seeded_reproducible_and_constant_grid_search():
    space = {"lr": sp.uniform(0, 1), "g": sp.grid_search(["a", "b"])}
    first = [t.config for t in drain(bvg(space, 3, random_state=42))]
    again = [t.config for t in drain(bvg(space, 3, random_state=42))]
    other = [t.config for t in drain(bvg(space, 3, random_state=43))]
    assert first == again and first != other
    const = [t.config for t in drain(bvg(space, 2, random_state=1, constant_grid_search=True))]
    assert const[0]["lr"] == const[1]["lr"] != const[2]["lr"] == const[3]["lr"]
    seeded = BasicVariantGenerator()
    seeded.set_search_properties(None, None, space, num_samples=2, seed=42)
    assert [t.config for t in drain(seeded)] == first[:4]


def test_bvg_no_space_and_sample_from():
    alg = bvg({}, num_samples=3)
    trials = drain(alg)
    assert [t.config for t in trials] == [{}, {}, {}] and trials[0].experiment_tag == "0"
    space = {"a": sp.grid_search([1, 2]), "b": sp.sample_from(lambda spec: spec.config.a * 10)}
    assert [t.config["b"] for t in drain(bvg(space))] == [10, 20]


def test_bvg_points_to_evaluate_first_and_counted():
    space = {"lr": sp.uniform(0, 1), "g": sp.grid_search([1, 2])}
    points = [{"lr": 0.5}, {"lr": 0.25, "g": 7}]
    alg = bvg(space, num_samples=3, points_to_evaluate=points, random_state=0)
    # point 1 keeps g's grid (2 trials), point 2 fixes g (1 trial), one random sample (2)
    assert alg.total_samples == 5
    trials = drain(alg)
    assert [(t.config["lr"], t.config["g"]) for t in trials[:3]] == [
        (0.5, 1), (0.5, 2), (0.25, 7)
    ]
    assert len(trials) == 5 and trials[2].experiment_tag == "2"
    with pytest.raises(ValueError, match="'nope' is not in the param_space"):
        bvg(space, points_to_evaluate=[{"nope": 1}])
    with pytest.raises(TypeError, match="list of dicts"):
        BasicVariantGenerator(points_to_evaluate={"lr": 1})


def test_bvg_max_concurrent():
    alg = bvg({"x": sp.uniform(0, 1)}, num_samples=4, max_concurrent=2)
    a, b = alg.next_trial(), alg.next_trial()
    assert alg.next_trial() is None and not alg.is_finished()
    alg.on_trial_complete(a.trial_id, {"loss": 1})
    assert alg.next_trial() is not None and alg.next_trial() is None
    alg.on_trial_complete(b.trial_id)
    assert alg.next_trial() is not None


def test_bvg_infinite():
    alg = bvg({"x": sp.uniform(0, 1)}, num_samples=-1)
    assert alg.total_samples is None
    assert len(drain(alg, limit=50)) == 50 and not alg.is_finished()
    with pytest.raises(ValueError, match="num_samples"):
        bvg({}, num_samples=0)


@pytest.mark.parametrize("constant", [False, True])
def test_bvg_state_restore_continues(constant):
    space = {"lr": sp.loguniform(1e-4, 1), "g": sp.grid_search([1, 2, 3])}
    points = [{"lr": 0.1}]
    full = drain(bvg(space, 3, random_state=5, points_to_evaluate=points,
                     constant_grid_search=constant))
    alg = bvg(space, 3, random_state=5, points_to_evaluate=points, constant_grid_search=constant)
    head = drain(alg, limit=4)
    state = pickle.loads(pickle.dumps(alg.get_state()))
    fresh = BasicVariantGenerator(points_to_evaluate=points, constant_grid_search=constant)
    fresh.set_search_properties("loss", "min", space, num_samples=3, experiment_uid="ffffffff")
    fresh.set_state(state)
    tail = drain(fresh)
    assert [(t.trial_id, t.config, t.experiment_tag) for t in head + tail] == [
        (t.trial_id, t.config, t.experiment_tag) for t in full
    ]
    assert fresh.is_finished() and len(full) == 9


def test_bvg_positional_arguments_in_rays_order():
    names = list(inspect.signature(BasicVariantGenerator).parameters)
    assert names[:4] == ["points_to_evaluate", "max_concurrent", "constant_grid_search",
                         "random_state"]
    space = {"g": sp.grid_search([1, 2]), "r": sp.uniform(0, 1)}
    positional = BasicVariantGenerator(None, 0, True, 7)
    keywords = BasicVariantGenerator(constant_grid_search=True, random_state=7)
    for alg in (positional, keywords):
        alg.set_search_properties("loss", "min", space, num_samples=2, experiment_uid=UID)
    configs = [t.config for t in drain(positional)]
    assert configs == [t.config for t in drain(keywords)]
    assert configs[0]["r"] == configs[1]["r"] != configs[2]["r"]  # constant over the grid


def test_bvg_bad_input():
    with pytest.raises(TypeError, match="Mapping"):
        bvg([1])
    with pytest.raises(ValueError, match="experiment_uid"):
        BasicVariantGenerator(experiment_uid="XYZ")
    with pytest.raises(RuntimeError, match="set_search_properties"):
        BasicVariantGenerator().next_trial()


# -- SearchGenerator ------------------------------------------------------------------


def test_search_generator_merges_constants_and_counts():
    searcher = ListSearcher([{"a": 1, "m": {"b": 2}}, "wait", {"a": 3, "m": {"b": 4}}, {"a": 5}])
    gen = SearchGenerator(searcher, 3, experiment_uid=UID)
    gen.set_search_properties("loss", "min", {"c": "k", "m": {"d": 0}}, num_samples=99)
    assert gen.total_samples == 3 and searcher.metric == "loss"
    first = gen.next_trial()
    assert first == Suggestion(f"{UID}_00000", {"c": "k", "m": {"d": 0, "b": 2}, "a": 1},
                               "0_a=1,b=2")
    assert gen.next_trial() is None and not gen.is_finished()  # searcher said "not now"
    second = gen.next_trial()
    assert second.trial_id == f"{UID}_00001"
    assert gen.next_trial().config["a"] == 5
    assert gen.next_trial() is None and gen.is_finished()  # num_samples reached
    gen.on_trial_result(first.trial_id, {"loss": 1.0})
    gen.on_trial_complete(first.trial_id, {"loss": 0.5})
    assert searcher.results == [(first.trial_id, {"loss": 1.0})]
    assert searcher.completed == [(first.trial_id, {"loss": 0.5}, False)]


def test_search_generator_finished_infinite_and_spec_samples():
    gen = SearchGenerator(ListSearcher([{"a": 1}, {"a": 2}]), -1)
    gen.set_search_properties(None, None, {})
    assert gen.total_samples is None and len(drain(gen)) == 2 and gen.is_finished()
    gen = SearchGenerator(ListSearcher([{"a": i} for i in range(9)]))
    gen.set_search_properties(None, None, {}, num_samples=4)
    assert len(drain(gen)) == 4


def test_search_generator_errors():
    class OwnSpace(ListSearcher):
        def set_search_properties(self, metric, mode, config, **spec):
            return False

    gen = SearchGenerator(OwnSpace([]))
    with pytest.raises(ValueError, match="'lr'.*already instantiated with a search space"):
        gen.set_search_properties("loss", "min", {"lr": sp.uniform(0, 1)})
    gen.set_search_properties("loss", "min", {"const": 1})  # constants are fine
    with pytest.raises(ValueError, match="grid_search at 'g'.*BasicVariantGenerator"):
        SearchGenerator(ListSearcher([])).set_search_properties(
            None, None, {"g": sp.grid_search([1])}
        )
    with pytest.raises(ValueError, match="metric='acc'.*contradicts.*metric='loss'"):
        SearchGenerator(ListSearcher([], "loss", "min")).set_search_properties("acc", "max", {})
    gen = SearchGenerator(ListSearcher([{"a": 1}]), 1)
    gen.set_search_properties(None, None, {"b": sp.uniform(0, 1)})
    with pytest.raises(ValueError, match="no value for 'b'"):
        gen.next_trial()
    with pytest.raises(TypeError, match="Searcher"):
        SearchGenerator(object(), 1)


def test_search_generator_state():
    gen = SearchGenerator(ListSearcher([{"a": i} for i in range(5)]), 5, experiment_uid=UID)
    gen.set_search_properties(None, None, {})
    drain(gen, limit=2)
    state = pickle.loads(pickle.dumps(gen.get_state()))
    fresh = SearchGenerator(ListSearcher([]), 5)
    fresh.set_search_properties(None, None, {})
    fresh.set_state(state)
    rest = drain(fresh)
    assert [t.trial_id for t in rest] == [f"{UID}_{i:05d}" for i in (2, 3, 4)]
    assert [t.config["a"] for t in rest] == [2, 3, 4]


def test_searcher_base_contract(tmp_path):
    s = ListSearcher([{"a": 1}], metric="loss")
    assert s.set_search_properties(None, "min", {}) and s.mode == "min"
    assert not s.set_search_properties("acc", None, {})
    with pytest.raises(ValueError, match="mode"):
        Searcher(mode="up")
    with pytest.raises(ValueError, match="same length"):
        Searcher(metric=["a"], mode=["min", "max"])
    with pytest.raises(ValueError, match="same length"):
        Searcher(metric=["a", "b"], mode="min")
    s.save_to_dir(str(tmp_path), "s1")
    other = ListSearcher([])
    other.restore_from_dir(str(tmp_path))
    assert other.configs == [{"a": 1}]
    with pytest.raises(RuntimeError, match="searcher-state"):
        other.restore_from_dir(str(tmp_path / "empty"))
    with pytest.raises(NotImplementedError):
        Searcher().get_state()


def test_create_searcher_by_rays_names():
    for name in ("random", "variant_generator", "Random"):
        alg = create_searcher(name, random_state=3)
        assert isinstance(alg, BasicVariantGenerator)
    from dasktune.search.optuna import OptunaSearch

    optuna_search = create_searcher("optuna", metric="loss", mode="min", seed=1)
    assert isinstance(optuna_search, OptunaSearch) and optuna_search.metric == "loss"
    pytest.importorskip("hyperopt")
    from dasktune.search.hyperopt import HyperOptSearch

    assert isinstance(create_searcher("HyperOpt", metric="loss", mode="min"), HyperOptSearch)
    with pytest.raises(ValueError, match="unknown search algorithm"):
        create_searcher("nope")


class PointSearcher(ListSearcher):
    """Records the points it is told about."""

    def __init__(self) -> None:
        super().__init__([])
        self.points: list = []

    def add_evaluated_point(self, parameters, value, error=False, pruned=False,
                            intermediate_values=None):
        self.points.append((parameters, value, error))


def test_add_evaluated_trials_from_trials_and_result_grid():
    trials = [
        Trial("t0", {"a": 1}, status=TERMINATED, last_result={"loss": 0.5}),
        Trial("t1", {"a": 2}, status=ERROR, error_msg="boom"),
        Trial("t2", {"a": 3}, status=TERMINATED, last_result={"acc": 1.0}),  # no metric
    ]
    expected = [({"a": 1}, 0.5, False), ({"a": 2}, None, True)]
    for given in (trials, trials[0], ResultGrid(trials)):
        searcher = PointSearcher()
        searcher.add_evaluated_trials(given, "loss")
        assert searcher.points == (expected if given is not trials[0] else expected[:1])
    with pytest.raises(ValueError, match="no trial reported"):
        PointSearcher().add_evaluated_trials(trials[2:], "loss")


# -- ConcurrencyLimiter ---------------------------------------------------------------


def test_concurrency_limiter_limits():
    inner = ListSearcher([{"a": i} for i in range(6)], "loss", "min")
    limiter = ConcurrencyLimiter(inner, max_concurrent=2)
    gen = SearchGenerator(limiter, 6)
    gen.set_search_properties(None, None, {})
    a, b = gen.next_trial(), gen.next_trial()
    assert gen.next_trial() is None and limiter.metric == "loss"
    gen.on_trial_complete(a.trial_id, {"loss": 1})
    c = gen.next_trial()
    assert c is not None and gen.next_trial() is None
    assert [x[0] for x in inner.completed] == [a.trial_id]
    state = pickle.loads(pickle.dumps(limiter.get_state()))
    restored = ConcurrencyLimiter(ListSearcher([]), 2)
    restored.set_state(state)
    assert restored.live_trials == {b.trial_id, c.trial_id} and restored.searcher.configs
    with pytest.raises(ValueError, match="max_concurrent"):
        ConcurrencyLimiter(inner, 0)


def test_concurrency_limiter_batch():
    inner = ListSearcher([{"a": i} for i in range(6)])
    limiter = ConcurrencyLimiter(inner, max_concurrent=2, batch=True)
    limiter.set_search_properties("loss", "min", {})
    assert limiter.suggest("t1") and limiter.suggest("t2") and limiter.suggest("t3") is None
    limiter.on_trial_complete("t1", {"loss": 1})
    assert limiter.suggest("t3") is None and inner.completed == []  # batch not complete
    limiter.on_trial_complete("t2", {"loss": 2})
    assert [x[0] for x in inner.completed] == ["t1", "t2"] and limiter.suggest("t3")


class SelfLimiting(ListSearcher):
    """Limits concurrency itself (as HEBO and BOHB do): records the limit it was given."""

    limit = None

    def set_max_concurrency(self, max_concurrent):
        self.limit = max_concurrent
        return True


def test_concurrency_limiter_hands_the_limit_to_a_searcher_that_limits_itself():
    inner = SelfLimiting([{"a": i} for i in range(5)], "loss", "min")
    limiter = ConcurrencyLimiter(inner, max_concurrent=2)
    assert inner.limit == 2  # told when the limiter is built, as in Ray
    gen = SearchGenerator(limiter, 5)
    gen.set_search_properties(None, None, {})
    assert len(drain(gen)) == 5  # the limiter only forwards: the searcher decides
    plain = ListSearcher([{"a": i} for i in range(5)], "loss", "min")
    gen = SearchGenerator(ConcurrencyLimiter(plain, max_concurrent=2), 5)
    gen.set_search_properties(None, None, {})
    assert len(drain(gen)) == 2


# -- Repeater -------------------------------------------------------------------------


def test_repeater_averages_and_indexes():
    inner = ListSearcher([{"a": 1}, {"a": 2}], "loss", "min")
    rep = Repeater(inner, repeat=3)
    gen = SearchGenerator(rep, 6)
    gen.set_search_properties(None, None, {})
    trials = drain(gen)
    assert [t.config for t in trials[:3]] == [{"a": 1, TRIAL_INDEX: i} for i in range(3)]
    assert trials[3].config == {"a": 2, TRIAL_INDEX: 0}
    for t, loss in zip(trials[:3], [1.0, 2.0, 6.0], strict=True):
        assert inner.completed == []
        gen.on_trial_complete(t.trial_id, {"loss": loss})
    primary, result, error = inner.completed[0]
    assert primary == trials[0].trial_id and result == {"loss": 3.0} and not error  # Ray's
    # errors and NaN are skipped; all failed -> the group is an error
    gen.on_trial_complete(trials[3].trial_id, {"loss": float("nan")})
    gen.on_trial_complete(trials[4].trial_id, None, error=True)
    gen.on_trial_complete(trials[5].trial_id, {"other": 1})
    assert inner.completed[1] == (trials[3].trial_id, None, True)


def test_repeater_state_and_no_index():
    inner = ListSearcher([{"a": 1}], "loss", "min")
    rep = Repeater(inner, repeat=2, set_index=False)
    assert rep.suggest("t0") == {"a": 1}
    state = pickle.loads(pickle.dumps(rep.get_state()))
    fresh = Repeater(ListSearcher([], "loss", "min"), repeat=2)
    fresh.set_state(state)
    assert fresh.suggest("t1") == {"a": 1}
    fresh.on_trial_complete("t0", {"loss": 2.0})
    fresh.on_trial_complete("t1", {"loss": 4.0})
    assert fresh.searcher.completed[0][1]["loss"] == 3.0
    assert fresh.suggest("t2") == Searcher.FINISHED
    with pytest.raises(ValueError, match="repeat"):
        Repeater(inner, repeat=0)


class RandomSearcher(Searcher):
    """A user's own searcher: samples the param space with a seeded generator."""

    def __init__(self):
        super().__init__()
        self.space: dict = {}
        self.seen = 0

    def set_search_properties(self, metric, mode, config, **spec):
        self.space = config
        return super().set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id):
        self.seen += 1
        return sp.resolve(self.space, self.seen)[0]

    def get_state(self):
        return {"seen": self.seen}

    def set_state(self, state):
        self.seen = state["seen"]


def test_conformance_of_a_users_searcher():
    from dasktune.search.testing import check_searcher

    space = {"a": sp.uniform(0, 1), "b": {"c": sp.randint(0, 3), "k": "const"}}
    made = check_searcher(RandomSearcher, space, n_trials=6)
    assert len({m.config["a"] for m in made}) == 6
    limited = check_searcher(lambda: ConcurrencyLimiter(RandomSearcher(), 1), space, n_trials=4)
    assert len(limited) == 4
