"""Search-space domains, sampling and grid expansion.

The user-facing functions (``uniform``, ``choice``, ``grid_search``, ``sample_from``...) follow
Ray Tune's names and semantics. A *param space* is a nested structure of dicts and lists whose
leaves are :class:`Domain` objects, ``{"grid_search": [...]}`` dicts, or constants (passed
through unchanged). Paths inside a space are tuples of keys (``("model", "lr")``); where a
string is needed they are joined with ``"/"`` (``"model/lr"``).

The helpers the search algorithms use:

- :func:`grid_variants` expands every ``grid_search`` (nested ones too) in Ray's order;
- :func:`resolve` samples one config from a grid-free space, ``sample_from`` last;
- :func:`format_vars` makes Ray's experiment-tag suffix (``lr=0.0012,layers=2``).

The translation for Optuna lives with its searcher, in :mod:`dasktune.search.optuna_space`.
numpy is the only third-party import.

Over ~400 lines because it is Ray's ``tune.search.sample`` (the domains) and its
``variant_generator`` (walking, expanding and resolving a param space) in the one
namespace that every searcher uses as ``sp.X``; the two halves can become two modules
when the searchers' imports are changed with them.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "SEP",
    "Categorical",
    "Domain",
    "Float",
    "Function",
    "Integer",
    "as_generator",
    "assign_path",
    "choice",
    "copy_containers",
    "count_grid_variants",
    "expand_grid",
    "flatten_space",
    "format_vars",
    "grid_search",
    "grid_variants",
    "has_unresolved_values",
    "is_container",
    "is_grid",
    "leaves",
    "lograndint",
    "loguniform",
    "path_str",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "resolve",
    "restore_tuples",
    "sample_domains",
    "sample_from",
    "unflatten",
    "uniform",
    "validate_param_space",
]

SEP = "/"
Path = tuple[Any, ...]


def as_generator(rng: Any = None) -> np.random.Generator:
    """Return a numpy ``Generator`` from a seed, a ``Generator``, a ``RandomState`` or None."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, np.random.RandomState):
        return np.random.default_rng(rng.randint(0, 2**32 - 1))
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise TypeError(f"random state must be an int, a numpy Generator/RandomState or None, got {rng!r}")


def _is_random_state(value: Any) -> bool:
    """Whether ``value`` is a seed or numpy generator (not a Ray ``config``/spec)."""
    if isinstance(value, (np.random.Generator, np.random.RandomState)):
        return True
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def path_str(path: Path) -> str:
    """``("model", "lr")`` -> ``"model/lr"``."""
    return SEP.join(str(k) for k in path)


def _with_path(exc: ValueError, path: Path) -> ValueError:
    return ValueError(f"parameter '{path_str(path)}': {exc}")


def _is_multiple(value: float, q: float) -> bool:
    ratio = value / q
    return math.isclose(ratio, round(ratio), rel_tol=1e-9, abs_tol=1e-9)


def _clean_float(value: float) -> float:
    # round(v / q) * q leaves noise like 0.30000000000000004; 15 significant digits removes it
    return float(f"{value:.15g}")


# --------------------------------------------------------------------------------------
# Domains
# --------------------------------------------------------------------------------------


class Domain:
    """A leaf of a search space that can be sampled (Ray's ``ray.tune.search.sample.Domain``).

    Subclasses validate their arguments when built, so a mistake raises where it is written.
    """

    sampler: str = "uniform"
    _sampler_set = False  # whether a sampler was chosen (Ray allows one per domain)

    def sample(self, config: Any = None, size: int = 1, random_state: Any = None) -> Any:
        """Draw ``size`` values, as Ray's ``Domain.sample(config, size, random_state)``.

        Returns one value when ``size == 1``, else a list of ``size`` values.
        ``random_state`` is an int seed, a numpy ``Generator`` or ``RandomState``, or None
        (fresh entropy); a seed gives the same draws on every call. ``config`` is the config
        a :func:`sample_from` function receives; other domains ignore it.
        ``sample(rng)`` with a seed or generator in first place (dasktune's older form) is
        still understood.
        """
        if random_state is None and _is_random_state(config):
            config, random_state = None, config
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"sample: size must be an int >= 1, got {size!r}")
        rng = as_generator(random_state)
        values = [self._draw(rng, config) for _ in range(int(size))]
        return values[0] if size == 1 else values

    def _draw(self, rng: np.random.Generator, spec: Any = None) -> Any:
        """Draw one value with ``rng``; what each domain type implements."""
        raise NotImplementedError

    def is_valid(self, value: Any) -> bool:
        """Whether ``value`` could have been drawn from this domain."""
        return True

    @property
    def domain_str(self) -> str:
        """A short human-readable description (used in warnings)."""
        return repr(self)

    def _copy(self) -> Domain:
        return copy.copy(self)


class _Numeric(Domain):
    """Shared sampler chaining of :class:`Float` and :class:`Integer`."""

    def __init__(self, lower: Any, upper: Any) -> None:
        self.lower = lower
        self.upper = upper
        self.sampler = "uniform"
        self.base: float = 10
        self.q: float | None = None

    def _set_sampler(self, sampler: str) -> _Numeric:
        """A copy with ``sampler`` chosen; a second choice is Ray's ValueError."""
        if self._sampler_set:
            raise ValueError(
                "You can only choose one sampler for parameter domains. Existing sampler for "
                f"parameter {type(self).__name__}: {self._sampler_name()}. Tried to add "
                f"{sampler}"
            )
        new = self._copy()
        new.sampler = sampler
        new._sampler_set = True
        return new

    def _sampler_name(self) -> str:
        return f"Quantized({self.sampler}, q={self.q})" if self.q is not None else self.sampler

    def _check_bounds(self) -> None:
        for name, bound in (("lower", self.lower), ("upper", self.upper)):
            if bound is None or not isinstance(bound, (int, float, np.number)):
                raise ValueError(f"{self.sampler} needs a numeric {name} bound, got {bound!r}")
            if not math.isfinite(bound):
                raise ValueError(f"{self.sampler} needs a finite {name} bound, got {bound!r}")
        if self.lower >= self.upper:
            raise ValueError(
                f"lower bound must be smaller than upper bound, got lower={self.lower!r} "
                f"upper={self.upper!r}"
            )
        if self.sampler == "loguniform":
            if self.lower <= 0:
                raise ValueError(f"loguniform needs a lower bound > 0, got {self.lower!r}")
            if not self.base > 0 or self.base == 1:
                raise ValueError(f"log base must be > 0 and != 1, got {self.base!r}")

    def uniform(self) -> _Numeric:
        """Sample uniformly between the bounds."""
        new = self._set_sampler("uniform")
        new._check()
        return new

    def loguniform(self, base: float = 10) -> _Numeric:
        """Sample uniformly in log space between the bounds."""
        new = self._set_sampler("loguniform")
        new.base = base
        new._check()
        return new

    def quantized(self, q: float) -> _Numeric:
        """Round samples to multiples of ``q`` (after the sampler chosen, if any)."""
        new = self._copy()
        new.q = q
        new._sampler_set = True  # as Ray: a sampler (the default one) is now chosen
        new._check()
        return new

    def _check(self) -> None:
        raise NotImplementedError

    def _log_uniform(self, rng: np.random.Generator, low: float, high: float) -> float:
        log_b = math.log(self.base)
        return float(self.base ** rng.uniform(math.log(low) / log_b, math.log(high) / log_b))


class Float(_Numeric):
    """A float domain. ``Float(0, 1).uniform()``, ``.loguniform(base)``, ``.normal(mean, sd)``,
    each optionally ``.quantized(q)``. Bounds are inclusive."""

    def __init__(self, lower: float | None, upper: float | None) -> None:
        super().__init__(lower, upper)
        self.mean = 0.0
        self.sd = 1.0

    def normal(self, mean: float = 0.0, sd: float = 1.0) -> Float:
        """Sample from a normal distribution (bounds are ignored)."""
        new = self._set_sampler("normal")
        new.mean, new.sd = mean, sd
        new._check()
        return new

    def _check(self) -> None:
        if self.sampler == "normal":
            if not (isinstance(self.sd, (int, float)) and self.sd > 0):
                raise ValueError(f"normal needs sd > 0, got {self.sd!r}")
        else:
            self._check_bounds()
        if self.q is not None:
            if not (isinstance(self.q, (int, float)) and not isinstance(self.q, bool)) or not (
                self.q > 0
            ):
                raise ValueError(f"quantization q must be > 0, got {self.q!r}")
            if self.sampler != "normal":
                for name, bound in (("lower", self.lower), ("upper", self.upper)):
                    if not _is_multiple(bound, self.q):
                        raise ValueError(
                            f"{name} bound {bound!r} is not a multiple of quantization q={self.q!r}"
                        )

    def _draw(self, rng: np.random.Generator, spec: Any = None) -> float:
        if self.sampler == "normal":
            value = float(rng.normal(self.mean, self.sd))
        elif self.sampler == "loguniform":
            value = self._log_uniform(rng, self.lower, self.upper)
        else:
            value = float(rng.uniform(self.lower, self.upper))
        if self.q is not None:
            value = _clean_float(round(value / self.q) * self.q)
        if self.sampler != "normal":
            value = min(max(value, float(self.lower)), float(self.upper))
        return value

    def is_valid(self, value: Any) -> bool:
        if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
            return False
        return self.sampler == "normal" or self.lower <= value <= self.upper

    @property
    def domain_str(self) -> str:
        if self.sampler == "normal":
            return f"Normal(mean={self.mean}, sd={self.sd})"
        return f"({self.lower}, {self.upper})"

    def __repr__(self) -> str:
        q = f", q={self.q}" if self.q is not None else ""
        if self.sampler == "normal":
            return f"Float(normal, mean={self.mean}, sd={self.sd}{q})"
        return f"Float({self.sampler}, lower={self.lower}, upper={self.upper}{q})"


class Integer(_Numeric):
    """An integer domain. Unquantized, ``upper`` is exclusive (``randint``); quantized, it is
    inclusive (``qrandint``), as in Ray."""

    def _check(self) -> None:
        for name, bound in (("lower", self.lower), ("upper", self.upper)):
            if isinstance(bound, float) and bound.is_integer():
                setattr(self, name, int(bound))
            elif not isinstance(bound, (int, np.integer)) or isinstance(bound, bool):
                raise ValueError(f"integer domain needs an int {name} bound, got {bound!r}")
        self._check_bounds()
        if self.q is not None:
            if not isinstance(self.q, (int, np.integer)) or isinstance(self.q, bool):
                raise ValueError(f"integer quantization q must be an int, got {self.q!r}")
            if self.q <= 0:
                raise ValueError(f"quantization q must be > 0, got {self.q!r}")
            if self.q_low() > self.q_high():
                raise ValueError(
                    f"no multiple of q={self.q} between {self.lower} and {self.upper}"
                )

    def q_low(self) -> int:
        """The smallest multiple of ``q`` a quantized domain draws."""
        return -(-self.lower // self.q) * self.q

    def q_high(self) -> int:
        """The largest multiple of ``q`` a quantized domain draws."""
        return (self.upper // self.q) * self.q

    def _draw(self, rng: np.random.Generator, spec: Any = None) -> int:
        q = self.q
        if self.sampler == "loguniform":
            value = self._log_uniform(rng, self.lower, self.upper)
            if q is None:
                return int(min(math.floor(value), self.upper - 1))
            return int(min(max(round(value / q) * q, self.q_low()), self.q_high()))
        if q is None:
            return int(rng.integers(self.lower, self.upper))
        return int(rng.integers(self.q_low() // q, self.q_high() // q + 1)) * q

    def is_valid(self, value: Any) -> bool:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            return False
        if self.q is None:
            return self.lower <= value < self.upper
        return self.q_low() <= value <= self.q_high() and value % self.q == 0

    @property
    def domain_str(self) -> str:
        close = "]" if self.q is not None else ")"
        return f"[{self.lower}, {self.upper}{close}"

    def __repr__(self) -> str:
        q = f", q={self.q}" if self.q is not None else ""
        return f"Integer({self.sampler}, lower={self.lower}, upper={self.upper}{q})"


class Categorical(Domain):
    """One of a list of categories, drawn uniformly."""

    def __init__(self, categories: Sequence[Any]) -> None:
        values = _as_list(categories, "choice", "categories")
        if len(values) == 0:
            raise ValueError("choice needs at least one category, got an empty list")
        self.categories = values

    def uniform(self) -> Categorical:
        """Ray's spelling; categories are always drawn uniformly (chosen once, as Ray)."""
        if self._sampler_set:
            raise ValueError(
                "You can only choose one sampler for parameter domains. Existing sampler for "
                "parameter Categorical: uniform. Tried to add uniform"
            )
        new = copy.copy(self)
        new._sampler_set = True
        return new

    def _draw(self, rng: np.random.Generator, spec: Any = None) -> Any:
        index = int(rng.integers(len(self.categories)))
        # a copy, so that trials never share a mutable category (a dict or list)
        return copy.deepcopy(self.categories[index])

    def is_valid(self, value: Any) -> bool:
        return value in self.categories

    @property
    def domain_str(self) -> str:
        return repr(self.categories)

    def __repr__(self) -> str:
        return f"Categorical({self.categories!r})"


class Function(Domain):
    """A value computed by ``func(config)`` (or ``func()``) after the other parameters are drawn.

    As in Ray 2.60, ``func`` is given the resolved config (grid values included), readable
    as ``config["lr"]`` or ``config.lr``; only if that raises ``KeyError`` or
    ``AttributeError`` is it called again with the legacy spec, ``spec.config.lr``
    (deprecated in Ray, with a warning). Reading a value that is itself still unresolved
    defers this one.
    """

    sampler = "function"
    _warned_spec = False

    def __init__(self, func: Callable[..., Any]) -> None:
        if not callable(func):
            raise TypeError(f"sample_from needs a callable, got {func!r}")
        self.func = func
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):  # builtins without a signature: assume func(config)
            self.pass_config = True
            return
        try:
            sig.bind(None)
            self.pass_config = True
        except TypeError:
            try:
                sig.bind()
            except TypeError as exc:
                raise ValueError(
                    "the function given to sample_from must take 0 or 1 arguments (config)"
                ) from exc
            self.pass_config = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "pass_spec" in state:  # pickled by an earlier dasktune (an experiment's tuner.pkl)
            state["pass_config"] = state.pop("pass_spec")
        self.__dict__.update(state)

    def _draw(self, rng: np.random.Generator, spec: Any = None) -> Any:
        """``spec`` is the resolved config (a dict), as in Ray's ``Domain.sample(config)``."""
        if not self.pass_config:
            return self.func()
        config = spec if isinstance(spec, _AttrDict) else _AttrDict(spec or {})
        try:
            return self.func(config)
        except (AttributeError, KeyError):
            value = self.func(_AttrDict({"config": config}))
            if not self._warned_spec:
                self._warned_spec = True
                logger.warning(
                    "sample_from functions that take a spec dict are deprecated. Please "
                    "update your function to work with the config dict directly.")
            return value

    def __repr__(self) -> str:
        return f"Function({getattr(self.func, '__qualname__', self.func)!r})"


# --------------------------------------------------------------------------------------
# Ray's constructors
# --------------------------------------------------------------------------------------


def uniform(lower: float, upper: float) -> Float:
    """A float drawn uniformly from ``[lower, upper]``."""
    return Float(lower, upper).uniform()


def quniform(lower: float, upper: float, q: float) -> Float:
    """A float drawn uniformly from ``[lower, upper]`` and rounded to a multiple of ``q``."""
    return Float(lower, upper).uniform().quantized(q)


def loguniform(lower: float, upper: float, base: float = 10) -> Float:
    """A float drawn uniformly in log space from ``[lower, upper]``."""
    return Float(lower, upper).loguniform(base)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    """A log-uniform float rounded to a multiple of ``q``."""
    return Float(lower, upper).loguniform(base).quantized(q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Float:
    """A float drawn from a normal distribution."""
    return Float(None, None).normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Float:
    """A normal float rounded to a multiple of ``q``."""
    return Float(None, None).normal(mean, sd).quantized(q)


def randint(lower: int, upper: int) -> Integer:
    """An int drawn uniformly from ``[lower, upper)`` (upper exclusive)."""
    return Integer(lower, upper).uniform()


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """A multiple of ``q`` drawn uniformly from ``[lower, upper]`` (upper inclusive, as Ray)."""
    return Integer(lower, upper).uniform().quantized(q)


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    """An int drawn log-uniformly from ``[lower, upper)`` (upper exclusive)."""
    return Integer(lower, upper).loguniform(base)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Integer:
    """A log-uniform int rounded to a multiple of ``q`` in ``[lower, upper]`` (inclusive)."""
    return Integer(lower, upper).loguniform(base).quantized(q)


def choice(categories: Sequence[Any]) -> Categorical:
    """One of ``categories``, drawn uniformly."""
    return Categorical(categories).uniform()


def grid_search(values: Sequence[Any]) -> dict[str, list[Any]]:
    """Every value in turn: returns ``{"grid_search": [...]}`` like Ray."""
    items = _as_list(values, "grid_search", "values")
    if len(items) == 0:
        raise ValueError("grid_search needs at least one value, got an empty list")
    return {"grid_search": items}


def _as_list(values: Any, where: str, what: str) -> list[Any]:
    """Any finite ordered collection (list, tuple, range, numpy array) as a list.

    Numpy scalars become Python ones (``.tolist()``), so configs stay JSON-able.
    A str, bytes, mapping or set is refused: its items are not what the user meant
    (or have no order, which would break seeded reproducibility).
    """
    if isinstance(values, (str, bytes, Mapping, set, frozenset)):
        raise TypeError(f"{where} needs a list of {what}, got {values!r}")
    tolist = getattr(values, "tolist", None)
    if callable(tolist) and getattr(values, "ndim", 1) >= 1:  # numpy / pandas
        out = tolist()
        if isinstance(out, list):
            return out
    if not isinstance(values, Sequence):
        try:
            return list(values)  # other ordered iterables, e.g. dict views or generators
        except TypeError:
            raise TypeError(f"{where} needs a list of {what}, got {values!r}") from None
    return list(values)


def sample_from(func: Callable[..., Any]) -> Function:
    """A value computed by ``func(config)`` from the rest of the config (``config["lr"]``;
    the legacy ``spec.config.lr`` form still works)."""
    return Function(func)


# --------------------------------------------------------------------------------------
# Walking a space
# --------------------------------------------------------------------------------------


def is_grid(value: Any) -> bool:
    """Whether ``value`` is a ``{"grid_search": [...]}`` entry (Ray's test: the only key)."""
    return isinstance(value, Mapping) and len(value) == 1 and "grid_search" in value


def is_container(value: Any) -> bool:
    """Whether ``value`` is walked into: a dict (not a grid entry), a list or a tuple."""
    return (isinstance(value, Mapping) and not is_grid(value)) or isinstance(value, (list, tuple))


def _children(value: Any) -> Any:
    return value.items() if isinstance(value, Mapping) else enumerate(value)


def leaves(space: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    """Every (path, leaf) under ``space``, in iteration order; grid dicts are leaves."""
    out: list[tuple[Path, Any]] = []
    for key, value in _children(space):
        path = (*prefix, key)
        if is_container(value):
            out.extend(leaves(value, path))
        else:
            out.append((path, value))
    return out


def copy_containers(space: Any) -> Any:
    """Copy dicts, lists and tuples; share leaves (Domains and constants are not copied)."""
    if isinstance(space, Mapping) and not is_grid(space):
        return {k: copy_containers(v) for k, v in space.items()}
    if isinstance(space, list):
        return [copy_containers(v) for v in space]
    if isinstance(space, tuple):
        return [copy_containers(v) for v in space]  # tuples become lists so values can be set
    return space


def restore_tuples(template: Any, value: Any) -> Any:
    """Turn lists back into tuples where ``template`` had tuples (undoes copy_containers)."""
    if isinstance(template, Mapping) and isinstance(value, dict) and not is_grid(template):
        return {k: restore_tuples(template[k], v) if k in template else v for k, v in value.items()}
    if isinstance(template, (list, tuple)) and isinstance(value, list):
        items = [restore_tuples(t, v) for t, v in zip(template, value, strict=False)]
        return tuple(items) if isinstance(template, tuple) else items
    return value


def assign_path(spec: Any, path: Path, value: Any) -> None:
    """Set ``value`` at ``path`` inside ``spec`` (the containers must exist)."""
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _path_sort_key(path: Path) -> tuple[tuple[int, Any], ...]:
    # ints (list indices) sort numerically, everything else by its string
    return tuple((0, k) if isinstance(k, int) else (1, str(k)) for k in path)


def has_unresolved_values(space: Any) -> bool:
    """Whether ``space`` still holds a Domain or a grid_search anywhere."""
    if not is_container(space):
        return isinstance(space, Domain) or is_grid(space)
    return any(isinstance(v, Domain) or is_grid(v) for _, v in leaves(space))


def validate_param_space(space: Any) -> None:
    """Check a param space; TypeError if it is not a mapping, ValueError naming the bad path."""
    if not isinstance(space, Mapping):
        raise TypeError(f"param_space must be a dict (a Mapping), got {type(space).__name__}")
    _validate(space, ())


def _validate(node: Any, prefix: Path) -> None:
    for path, value in leaves(node, prefix):
        where = f"parameter '{path_str(path)}'"
        if is_grid(value):
            values = value["grid_search"]
            if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
                raise ValueError(f"{where}: grid_search needs a list of values, got {values!r}")
            if len(values) == 0:
                raise ValueError(f"{where}: grid_search needs at least one value, got []")
            for item in values:
                if is_container(item):
                    _validate(item, path)
        elif isinstance(value, (Float, Integer)):
            try:
                value._check()
            except ValueError as exc:
                raise _with_path(exc, path) from None
        elif isinstance(value, Categorical) and not value.categories:
            raise ValueError(f"{where}: choice has no categories")


# --------------------------------------------------------------------------------------
# Grid expansion and resolution
# --------------------------------------------------------------------------------------


def expand_grid(space: Mapping[str, Any]) -> list[tuple[dict[Path, Any], dict[str, Any]]]:
    """(grid assignments, spec) for every grid variant, in Ray's order.

    Grid paths are sorted; the first one varies fastest (Ray's ``_grid_search_generator``).
    Grid values that themselves contain grid_search entries are expanded in turn.
    """
    grids = sorted(
        ((p, v["grid_search"]) for p, v in leaves(space) if is_grid(v)),
        key=lambda item: _path_sort_key(item[0]),
    )
    if not grids:
        return [({}, copy_containers(space))]
    out: list[tuple[dict[Path, Any], dict[str, Any]]] = []
    # itertools.product varies its last argument fastest; Ray varies the first fastest
    for combo in itertools.product(*(values for _, values in reversed(grids))):
        spec = copy_containers(space)
        assigned: dict[Path, Any] = {}
        for (path, _), value in zip(reversed(grids), combo, strict=True):
            assign_path(spec, path, copy_containers(value))
            assigned[path] = value
        ordered = {path: assigned[path] for path, _ in grids}
        for sub_assigned, sub_spec in expand_grid(spec):
            out.append(({**ordered, **sub_assigned}, sub_spec))
    return out


def grid_variants(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cross product of every ``grid_search`` in ``space`` (nested too), in Ray's order.

    Random domains are left in place; a space without grid_search gives one variant.
    """
    validate_param_space(space)
    return [spec for _, spec in expand_grid(space)]


def count_grid_variants(space: Mapping[str, Any]) -> int:
    """How many variants :func:`grid_variants` would give."""
    return len(expand_grid(space))


class _Unresolved(Exception):
    """A sample_from function read a value that is not resolved yet."""


class _AttrDict(dict):
    """A dict readable by attribute (``spec.config.lr``), as Ray's spec is.

    Reading a value that is still a Domain raises :class:`_Unresolved`, so that the
    function reading it is retried after that value is drawn.
    """

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if isinstance(value, Domain):
            raise _Unresolved(key)
        if isinstance(value, dict) and not isinstance(value, _AttrDict):
            value = _AttrDict(value)
        elif isinstance(value, list):
            value = _AttrList(value)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _AttrList(list):
    def __getitem__(self, index: Any) -> Any:
        value = list.__getitem__(self, index)
        if isinstance(value, Domain):
            raise _Unresolved(index)
        if isinstance(value, dict):
            return _AttrDict(value)
        return value


def resolve(
    space: Mapping[str, Any],
    rng: Any = None,
    fixed: Mapping[Path, Any] | None = None,
) -> tuple[dict[str, Any], dict[Path, Any]]:
    """Sample one config from a grid-free ``space``.

    Domains are drawn first (in iteration order), then ``sample_from`` functions, retried
    until each can read what it depends on. ``fixed`` gives values to use instead of drawing
    (constant grid search). Returns ``(config, resolved_vars)`` where ``resolved_vars`` maps
    each sampled path to its value (for the experiment tag).
    """
    rng = as_generator(rng)
    config = copy_containers(space)
    resolved: dict[Path, Any] = {}
    functions: list[tuple[Path, Function]] = []
    for path, value in leaves(config):
        if is_grid(value):
            raise ValueError(
                f"parameter '{path_str(path)}': grid_search must be expanded before sampling "
                "(use grid_variants)"
            )
        if isinstance(value, Function):
            functions.append((path, value))
        elif isinstance(value, Domain):
            drawn = fixed[path] if fixed is not None and path in fixed else value._draw(rng)
            assign_path(config, path, drawn)
            resolved[path] = drawn
    while functions:
        deferred: list[tuple[Path, Function]] = []
        for path, func in functions:
            try:
                drawn = func._draw(rng, _AttrDict(config))
            except _Unresolved:
                deferred.append((path, func))
                continue
            if isinstance(drawn, Domain):  # Ray allows sample_from(lambda _: tune.uniform(...))
                drawn = drawn._draw(rng)
            assign_path(config, path, drawn)
            resolved[path] = drawn
        if len(deferred) == len(functions):
            names = ", ".join(f"'{path_str(p)}'" for p, _ in deferred)
            raise ValueError(f"sample_from parameters depend on each other in a cycle: {names}")
        functions = deferred
    return restore_tuples(space, config), resolved


def sample_domains(space: Mapping[str, Any], rng: Any = None) -> dict[Path, Any]:
    """Draw every plain Domain (not grid_search, not sample_from) once, by path."""
    rng = as_generator(rng)
    return {
        path: value._draw(rng)
        for path, value in leaves(space)
        if isinstance(value, Domain) and not isinstance(value, Function)
    }


# --------------------------------------------------------------------------------------
# Tags and flattening
# --------------------------------------------------------------------------------------

_INVALID_TAG_CHARS = re.compile(r"[^a-zA-Z0-9_.-]+")


def _clean_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    return _INVALID_TAG_CHARS.sub("_", str(value)).strip("_")


def format_vars(resolved_vars: Mapping[Any, Any]) -> str:
    """Ray's experiment-tag suffix: ``last_key=value`` pairs sorted by path, comma separated.

    Keys are paths (tuples, or strings joined with ``"/"``); floats are shortened to five
    significant digits and characters unsafe in directory names become ``_``.
    """
    items = []
    for key, value in resolved_vars.items():
        path = key if isinstance(key, tuple) else tuple(str(key).split(SEP))
        items.append((path, value))
    items.sort(key=lambda item: _path_sort_key(item[0]))
    return ",".join(f"{_clean_value(path[-1])}={_clean_value(value)}" for path, value in items)


def flatten_space(space: Mapping[str, Any], sep: str = SEP) -> dict[str, Any]:
    """Flatten nested dicts to ``{"a/b": leaf}``; grid dicts and lists are leaves."""
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if not isinstance(key, str):
                raise TypeError(f"keys must be strings to flatten, got {key!r} under '{prefix}'")
            if sep in key:
                raise ValueError(f"key '{key}' contains the separator {sep!r}")
            name = f"{prefix}{sep}{key}" if prefix else key
            if isinstance(value, Mapping) and value and not is_grid(value):
                walk(value, name)
            else:
                out[name] = value

    walk(space, "")
    return out


def unflatten(flat: Mapping[str, Any], sep: str = SEP) -> dict[str, Any]:
    """Inverse of :func:`flatten_space`: ``{"a/b": 1}`` -> ``{"a": {"b": 1}}``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        keys = str(name).split(sep)
        node = out
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ValueError(f"'{name}' nests under '{key}', which holds a value")  # noqa: TRY004
            node = child
        if isinstance(node.get(keys[-1]), dict) and isinstance(value, Mapping):
            node[keys[-1]].update(value)
        else:
            node[keys[-1]] = value
    return out
