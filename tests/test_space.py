"""Search-space domains: sampling ranges, seeds, grids, sample_from, validation, tags, Optuna."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dasktune import space as sp


def draws(domain: sp.Domain, n: int = 400, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [domain.sample(rng) for _ in range(n)]


# -- sampling ranges ------------------------------------------------------------------


def test_uniform_and_loguniform_ranges():
    values = draws(sp.uniform(-2.0, 3.0))
    assert all(-2.0 <= v <= 3.0 for v in values) and all(isinstance(v, float) for v in values)
    logs = draws(sp.loguniform(1e-4, 1e-1))
    assert all(1e-4 <= v <= 1e-1 for v in logs)
    # log-uniform: about a third of the draws in each decade
    assert 80 < sum(v < 1e-3 for v in logs) < 190
    base2 = draws(sp.loguniform(1, 1024, base=2))
    assert all(1 <= v <= 1024 for v in base2)


def test_quantized_floats():
    values = draws(sp.quniform(0.0, 1.0, 0.25))
    assert set(values) <= {0.0, 0.25, 0.5, 0.75, 1.0} and len(set(values)) == 5
    tenths = draws(sp.quniform(0.0, 0.3, 0.1))
    assert set(tenths) <= {0.0, 0.1, 0.2, 0.3}  # no 0.30000000000000004
    logq = draws(sp.qloguniform(0.1, 10.0, 0.1))
    assert all(0.1 <= v <= 10.0 and math.isclose(round(v / 0.1) * 0.1, v) for v in logq)


def test_normal():
    values = draws(sp.randn(5.0, 0.1), n=1000)
    assert abs(np.mean(values) - 5.0) < 0.02 and 0.08 < np.std(values) < 0.12
    assert all(float(v / 0.5).is_integer() for v in draws(sp.qrandn(0, 3, 0.5)))


def test_integers_upper_bounds_like_ray():
    assert set(draws(sp.randint(0, 3))) == {0, 1, 2}  # exclusive
    assert set(draws(sp.qrandint(0, 3))) == {0, 1, 2, 3}  # inclusive
    assert set(draws(sp.qrandint(0, 10, 5))) == {0, 5, 10}
    assert set(draws(sp.qrandint(1, 10, 3))) == {3, 6, 9}
    logs = draws(sp.lograndint(1, 10))
    assert set(logs) <= set(range(1, 10)) and all(isinstance(v, int) for v in logs)
    qlogs = draws(sp.qlograndint(2, 100, 2))
    assert all(2 <= v <= 100 and v % 2 == 0 for v in qlogs) and 100 in set(
        draws(sp.qlograndint(2, 100, 50), n=200)
    )


def test_choice_returns_the_objects_and_copies_mutables():
    cats = [{"a": 1}, "x", 3]
    values = draws(sp.choice(cats), n=100)
    assert {repr(v) for v in values} == {repr(c) for c in cats}
    first = next(v for v in values if isinstance(v, dict))
    first["a"] = 2
    assert cats[0] == {"a": 1}


def test_seeds_reproducible():
    space = {"a": sp.uniform(0, 1), "b": sp.choice([1, 2, 3]), "c": {"d": sp.randint(0, 100)}}
    one = [sp.resolve(space, np.random.default_rng(7))[0] for _ in range(3)]
    two = [sp.resolve(space, np.random.default_rng(7))[0] for _ in range(3)]
    assert one == two
    assert sp.resolve(space, 7)[0] == sp.resolve(space, 7)[0]
    assert sp.resolve(space, 7)[0] != sp.resolve(space, 8)[0]


# -- resolve and sample_from ----------------------------------------------------------


def test_resolve_nested_lists_constants_and_resolved_vars():
    marker = object()
    space = {
        "lr": sp.loguniform(1e-3, 1e-1),
        "layers": [sp.randint(1, 4), 64, {"act": sp.choice(["relu"])}],
        "pair": (sp.uniform(0, 1), "k"),
        "const": marker,
        "nested": {"n": 3},
    }
    config, resolved = sp.resolve(space, 0)
    assert config["const"] is marker and config["nested"] == {"n": 3}
    assert config["layers"][1] == 64 and config["layers"][2] == {"act": "relu"}
    assert isinstance(config["pair"], tuple) and config["pair"][1] == "k"
    assert set(resolved) == {("lr",), ("layers", 0), ("layers", 2, "act"), ("pair", 0)}
    assert isinstance(space["lr"], sp.Float)  # the space is untouched


def test_sample_from_sees_resolved_values_and_chains():
    space = {
        "c": sp.sample_from(lambda spec: spec.config.b + 1),
        "b": sp.sample_from(lambda spec: spec.config["a"] * 10),
        "a": sp.randint(1, 5),
        "m": {"x": sp.uniform(0, 1)},
        "y": sp.sample_from(lambda spec: spec.config.m.x * 2),
        "z": sp.sample_from(lambda: 42),
    }
    config, resolved = sp.resolve(space, 1)
    assert config["b"] == config["a"] * 10 and config["c"] == config["b"] + 1
    assert config["y"] == config["m"]["x"] * 2 and config["z"] == 42
    assert ("c",) in resolved


def test_sample_from_cycle_and_bad_arity():
    space = {
        "a": sp.sample_from(lambda spec: spec.config.b),
        "b": sp.sample_from(lambda spec: spec.config.a),
    }
    with pytest.raises(ValueError, match="cycle.*'a'"):
        sp.resolve(space, 0)
    with pytest.raises(ValueError, match="0 or 1 arguments"):
        sp.sample_from(lambda a, b: 1)
    with pytest.raises(TypeError, match="callable"):
        sp.sample_from(3)


def test_resolve_refuses_grid():
    with pytest.raises(ValueError, match="'g'.*grid_variants"):
        sp.resolve({"g": sp.grid_search([1, 2])}, 0)


# -- grid -----------------------------------------------------------------------------


def test_grid_search_is_rays_dict():
    assert sp.grid_search([1, 2]) == {"grid_search": [1, 2]}


def test_grid_variants_order_and_nesting():
    space = {"b": sp.grid_search([1, 2]), "a": sp.grid_search(["x", "y", "z"]), "c": 0}
    variants = sp.grid_variants(space)
    # Ray sorts grid paths and varies the first one fastest
    assert [(v["a"], v["b"]) for v in variants] == [
        ("x", 1), ("y", 1), ("z", 1), ("x", 2), ("y", 2), ("z", 2)
    ]
    assert all(v["c"] == 0 for v in variants)
    nested = {
        "m": {"k": sp.grid_search([1, 2])},
        "opt": sp.grid_search([{"name": "sgd", "lr": sp.grid_search([0.1, 0.2])}, {"name": "adam"}]),
    }
    got = [(v["m"]["k"], v["opt"]["name"], v["opt"].get("lr")) for v in sp.grid_variants(nested)]
    assert got == [
        (1, "sgd", 0.1), (1, "sgd", 0.2), (2, "sgd", 0.1), (2, "sgd", 0.2),
        (1, "adam", None), (2, "adam", None),
    ]
    assert sp.grid_variants({"x": sp.uniform(0, 1)})[0]["x"].sampler == "uniform"
    assert sp.count_grid_variants(space) == 6


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: sp.uniform(1, 1), "smaller than upper"),
        (lambda: sp.uniform(2, 1), "smaller than upper"),
        (lambda: sp.randint(5, 5), "smaller than upper"),
        (lambda: sp.qrandint(5, 1), "smaller than upper"),
        (lambda: sp.loguniform(0, 1), "loguniform needs a lower bound > 0"),
        (lambda: sp.lograndint(-1, 10), "loguniform needs a lower bound > 0"),
        (lambda: sp.loguniform(1, 10, base=1), "base"),
        (lambda: sp.choice([]), "at least one category"),
        (lambda: sp.quniform(0, 1, 0), "q must be > 0"),
        (lambda: sp.quniform(0, 1, -0.5), "q must be > 0"),
        (lambda: sp.qrandint(0, 10, 0), "q must be > 0"),
        (lambda: sp.qrandint(0, 10, 1.5), "must be an int"),
        (lambda: sp.quniform(0.05, 1, 0.1), "not a multiple"),
        (lambda: sp.qrandint(1, 2, 5), "no multiple"),
        (lambda: sp.randn(0, 0), "sd > 0"),
        (lambda: sp.grid_search([]), "at least one value"),
        (lambda: sp.uniform(0, float("inf")), "finite"),
    ],
)
def test_domain_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_validate_param_space_names_the_path():
    with pytest.raises(TypeError, match="Mapping"):
        sp.validate_param_space([1, 2])
    with pytest.raises(ValueError, match="'model/lr'.*at least one value"):
        sp.validate_param_space({"model": {"lr": {"grid_search": []}}})
    with pytest.raises(ValueError, match="'model/lr'.*list of values"):
        sp.validate_param_space({"model": {"lr": {"grid_search": "abc"}}})
    with pytest.raises(ValueError, match="'model/lr'.*smaller than upper"):
        sp.validate_param_space({"model": {"lr": sp.Float(3, 1)}})
    with pytest.raises(ValueError, match="'opt/x'"):
        sp.validate_param_space({"opt": sp.grid_search([{"x": sp.Float(0, -1)}])})
    with pytest.raises(TypeError, match="list of categories"):
        sp.choice("abc")
    sp.validate_param_space({"a": 1, "b": [sp.uniform(0, 1)], "c": sp.grid_search([1])})


# -- tags and flattening --------------------------------------------------------------


def test_format_vars_like_ray():
    tag = sp.format_vars({("lr",): 0.00123456, ("model", "layers"): 2, ("act",): "re lu/x"})
    assert tag == "act=re_lu_x,lr=0.0012346,layers=2"
    assert sp.format_vars({"a/b": 1e-05, "c": True}) == "b=1e-05,c=True"
    assert sp.format_vars({}) == ""


def test_flatten_unflatten():
    space = {"a": {"b": 1, "c": {"d": sp.uniform(0, 1)}}, "g": sp.grid_search([1]), "e": {}}
    flat = sp.flatten_space(space)
    assert set(flat) == {"a/b", "a/c/d", "g", "e"} and flat["g"] == {"grid_search": [1]}
    assert sp.unflatten({"a/b": 1, "a/c/d": 2, "x": 3}) == {"a": {"b": 1, "c": {"d": 2}}, "x": 3}
    with pytest.raises(ValueError, match="separator"):
        sp.flatten_space({"a/b": 1})
    assert sp.has_unresolved_values({"a": [1, sp.choice([1])]})
    assert not sp.has_unresolved_values({"a": [1, {"b": 2}]})


# -- Optuna translation ---------------------------------------------------------------


# -- Ray's Domain.sample(config=None, size=1, random_state=None) -------------------------

ALL_DOMAINS = {
    "uniform": (sp.uniform(0.0, 1.0), float),
    "quniform": (sp.quniform(0.0, 1.0, 0.25), float),
    "loguniform": (sp.loguniform(1e-4, 1e-1), float),
    "qloguniform": (sp.qloguniform(0.1, 10.0, 0.1), float),
    "randn": (sp.randn(0.0, 1.0), float),
    "qrandn": (sp.qrandn(0.0, 3.0, 0.5), float),
    "randint": (sp.randint(0, 10), int),
    "qrandint": (sp.qrandint(0, 20, 5), int),
    "lograndint": (sp.lograndint(1, 1000), int),
    "qlograndint": (sp.qlograndint(2, 100, 2), int),
    "choice": (sp.choice(["a", "b", "c", "d"]), str),
}


@pytest.mark.parametrize("name", sorted(ALL_DOMAINS))
def test_sample_has_rays_signature(name):
    domain, kind = ALL_DOMAINS[name]
    one = domain.sample()
    assert isinstance(one, kind) and domain.is_valid(one)  # one value, not a list
    five = domain.sample(size=5)
    assert isinstance(five, list) and len(five) == 5
    assert all(isinstance(v, kind) and domain.is_valid(v) for v in five)
    assert not isinstance(domain.sample(config=None, size=1, random_state=0), list)


@pytest.mark.parametrize("name", sorted(ALL_DOMAINS))
def test_seeded_sample_is_reproducible(name):
    domain, _ = ALL_DOMAINS[name]
    by_seed = domain.sample(size=50, random_state=123)
    assert domain.sample(None, 50, 123) == by_seed  # positional, in Ray's order
    assert domain.sample(size=50, random_state=np.random.default_rng(123)) == \
        domain.sample(size=50, random_state=np.random.default_rng(123))
    assert domain.sample(size=50, random_state=np.random.RandomState(123)) == \
        domain.sample(size=50, random_state=np.random.RandomState(123))
    assert domain.sample(size=50, random_state=124) != by_seed
    # a Generator is advanced, not copied: two calls draw different values
    rng = np.random.default_rng(5)
    assert domain.sample(size=50, random_state=rng) != domain.sample(size=50, random_state=rng)


def test_sample_from_sample_gets_the_config_as_ray_2_60():
    # Ray's Domain.sample(config): the function is given the config itself; the legacy
    # spec form (spec.config.x) is the fallback when that raises KeyError/AttributeError.
    double = sp.sample_from(lambda config: config["x"] * 2)
    assert double.sample({"x": 3}) == 6
    assert double.sample(config={"x": 4}, size=3) == [8, 8, 8]
    legacy = sp.sample_from(lambda spec: spec.config.x * 2)
    assert legacy.sample({"x": 5}) == 10
    assert sp.sample_from(lambda config: config.x + 1).sample({"x": 1}) == 2  # attribute form
    assert sp.sample_from(lambda: 7).sample() == 7


def test_sample_from_modern_form_sees_grid_values_and_legacy_form_warns(caplog):
    space = {
        "x": sp.grid_search([1, 2, 3]),
        "double": sp.sample_from(lambda config: config["x"] * 2),
        "nested": {"y": sp.uniform(0, 1)},
        "y_plus": sp.sample_from(lambda config: config["nested"]["y"] + config["double"]),
    }
    configs = [sp.resolve(variant, seed)[0]
               for seed, variant in enumerate(sp.grid_variants(space))]
    assert [c["double"] for c in configs] == [2, 4, 6]
    assert all(c["y_plus"] == c["nested"]["y"] + c["double"] for c in configs)
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
    # a missing key is the user's error, raised as it is (after the spec form failed too)
    with pytest.raises(KeyError, match="nope"):
        sp.resolve({"a": sp.sample_from(lambda config: config["nope"])}, 0)
    legacy = {"x": 3, "d": sp.sample_from(lambda spec: spec.config.x * 2)}
    with caplog.at_level("WARNING", logger="dasktune.space"):
        assert sp.resolve(legacy, 0)[0]["d"] == 6
    assert any("spec dict are deprecated" in r.getMessage() for r in caplog.records)


def test_a_domain_takes_one_sampler():
    # As Ray: quantized() may follow the sampler; a second sampler is a ValueError.
    q = sp.uniform(0, 1).quantized(0.25)
    assert q.q == 0.25 and q.sampler == "uniform"
    assert sp.Float(0, 1).quantized(0.5).q == 0.5
    assert sp.Integer(0, 10).uniform().quantized(2).sample(random_state=0) % 2 == 0
    for chained in (lambda: sp.Float(0, 1).normal().uniform(),
                    lambda: sp.uniform(0.1, 1).loguniform(),
                    lambda: sp.randint(1, 10).loguniform(),
                    lambda: sp.quniform(0, 1, 0.5).uniform(),
                    lambda: sp.choice([1, 2]).uniform()):
        with pytest.raises(ValueError, match="You can only choose one sampler"):
            chained()


def test_sample_keeps_the_positional_rng_form_and_checks_size():
    rng = np.random.default_rng(0)
    assert sp.uniform(0, 1).sample(rng) != sp.uniform(0, 1).sample(rng)
    assert sp.randint(0, 10**9).sample(3) == sp.randint(0, 10**9).sample(random_state=3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="size must be an int >= 1"):
            sp.uniform(0, 1).sample(size=bad)
    with pytest.raises(TypeError, match="random state"):
        sp.uniform(0, 1).sample(random_state="seed")
