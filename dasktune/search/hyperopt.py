"""``HyperOptSearch``: HyperOpt's TPE behind the :class:`Searcher` contract (Ray's).

Each ask is one call of ``hyperopt.tpe.suggest`` on a ``hyperopt.Trials`` that holds every
trial so far (in flight ones too, which TPE skips until they are done); a config is the space
evaluated at the trial's assignment (``hyperopt.space_eval``), so conditional spaces (a
``tune.choice`` or ``hp.choice`` of dicts holding parameters) give configs with only the
branch taken. ``points_to_evaluate`` are written into the Trials as they are asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from dasktune import space as sp
from dasktune.search._library import LibrarySearcher, import_library

hyperopt = import_library("hyperopt", "hyperopt", "HyperOptSearch")
from hyperopt import hp  # noqa: E402  (after the check that hyperopt is installed)
from hyperopt.pyll import Apply, as_apply, scope  # noqa: E402

__all__ = ["HyperOptSearch"]


class HyperOptSearch(LibrarySearcher):
    """Search with HyperOpt's Tree-structured Parzen Estimators (Ray's
    ``ray.tune.search.hyperopt.HyperOptSearch``).

    Args:
        space: a dasktune param space (translated by :meth:`convert_search_space`) or a
            HyperOpt space (``hp.uniform("width", 0, 20)``, ``hp.choice(...)``, nested);
            None: take the Tuner's ``param_space``.
        metric, mode: what to optimize.
        points_to_evaluate: configs to try first, in order; a ``choice`` is given by its
            value (for a conditional choice, the chosen dict with its parameters' values).
        n_initial_points: random trials before TPE models the results (HyperOpt's
            ``n_startup_jobs``).
        random_state_seed: seeds the search (``TuneConfig(seed=...)`` if None).
        gamma: TPE's quantile that splits good from bad trials.
    """

    _library = "HyperOpt"

    def __init__(
        self,
        space: dict | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict] | None = None,
        n_initial_points: int = 20,
        random_state_seed: int | None = None,
        gamma: float = 0.25,
    ) -> None:
        self._n_initial_points = n_initial_points
        self._seed = random_state_seed
        self._gamma = gamma
        super().__init__(space, metric, mode, points_to_evaluate)

    def _is_native(self, space: Any) -> bool:
        if isinstance(space, Apply):
            return True
        return isinstance(space, Mapping) and any(
            isinstance(v, Apply) for _, v in sp.leaves(space)
        )

    def _convert(self, space: dict) -> Any:
        return self.convert_search_space(space)

    @staticmethod
    def convert_search_space(spec: dict, prefix: str = "") -> dict:
        """A dasktune param space as a HyperOpt space (labels are ``"/"``-joined paths).

        A ``tune.choice`` whose categories hold parameters becomes a conditional
        ``hp.choice``; grid_search and sample_from can't be translated (ValueError).
        """
        out = sp.copy_containers(spec)
        for path, value in sp.leaves(spec):
            label = "/".join(str(p) for p in ((prefix, *path) if prefix else path))
            if sp.is_grid(value):
                raise ValueError(f"HyperOptSearch can't take grid_search (at '{label}')")
            if isinstance(value, sp.Domain):
                sp.assign_path(out, path, _to_hyperopt(label, value))
        return out

    def _take_seed(self, seed: int) -> None:
        if self._seed is None:
            self._seed = seed

    def _setup(self) -> Any:
        self._expr = as_apply(self._space)
        self._domain = hyperopt.Domain(lambda config: config, self._space)
        self._trials = hyperopt.Trials()
        self._rng = np.random.default_rng(self._seed)
        algo = hyperopt.tpe.suggest
        if self._n_initial_points is not None:
            algo = partial(algo, n_startup_jobs=self._n_initial_points)
        if self._gamma is not None:
            algo = partial(algo, gamma=self._gamma)
        return algo

    def _flat_point(self, point: Mapping[str, Any]) -> dict[str, Any]:
        vals: dict[str, Any] = {}
        if not _assign(self._expr, point, vals):
            raise ValueError(
                f"HyperOptSearch: the point {dict(point)!r} in points_to_evaluate does not "
                "fit the search space (a missing parameter, or a value no choice has)"
            )
        return vals

    def _ask(self, point: dict | None) -> tuple[Any, dict]:
        trials = self._trials
        [tid] = trials.new_trial_ids(1)
        if point is None:
            docs = self._opt([tid], self._domain, trials, int(self._rng.integers(2**31 - 1)))
        else:
            misc = {
                "tid": tid,
                "cmd": self._domain.cmd,
                "workdir": self._domain.workdir,
                "idxs": {label: [tid] if label in point else [] for label in self._domain.params},
                "vals": {label: [point[label]] if label in point else []
                         for label in self._domain.params},
            }
            docs = trials.new_trial_docs([tid], [None], [self._domain.new_result()], [misc])
        trials.insert_trial_docs(docs)
        trials.refresh()
        return tid, hyperopt.base.spec_from_misc(docs[0]["misc"])

    def _config(self, params: dict) -> dict:
        return hyperopt.space_eval(self._space, params)

    def _doc(self, tid: int) -> dict:
        return next(t for t in self._trials._dynamic_trials if t["tid"] == tid)

    def _tell(self, handle: Any, params: dict, loss: float, result: dict) -> None:
        doc = self._doc(handle)
        doc["state"] = hyperopt.JOB_STATE_DONE
        doc["result"] = {"loss": loss, "status": hyperopt.STATUS_OK}
        doc["refresh_time"] = hyperopt.utils.coarse_utcnow()
        self._trials.refresh()

    def _tell_failed(self, handle: Any, params: dict) -> None:
        doc = self._doc(handle)
        doc["state"] = hyperopt.JOB_STATE_ERROR
        doc["result"] = {"status": hyperopt.STATUS_FAIL}
        self._trials.refresh()

    def _state_dict(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_domain", None)  # rebuilt from the space (it holds a lambda's closure)
        return state

    def _load_state_dict(self, state: dict) -> None:
        super()._load_state_dict(state)
        if self._opt is not None:
            self._domain = hyperopt.Domain(lambda config: config, self._space)


def _to_hyperopt(label: str, domain: sp.Domain) -> Any:
    """One dasktune domain as a HyperOpt expression labelled ``label``."""
    if isinstance(domain, sp.Categorical):
        options = []
        for i, category in enumerate(domain.categories):
            if sp.is_container(category) and sp.has_unresolved_values(category):
                # a branch of a conditional space: its own parameters, labelled under it
                nested = HyperOptSearch.convert_search_space(
                    dict(enumerate(category)) if isinstance(category, Sequence) else category,
                    prefix=f"{label}/{i}",
                )
                if isinstance(category, Sequence):
                    nested = [nested[j] for j in range(len(category))]
                options.append(nested)
            elif isinstance(category, sp.Domain):
                options.append(_to_hyperopt(f"{label}/{i}", category))
            else:
                options.append(category)
        return hp.choice(label, options)
    if isinstance(domain, sp.Function):
        raise ValueError(f"HyperOptSearch can't take sample_from (at '{label}')")
    q = domain.q
    if isinstance(domain, sp.Float):
        if domain.sampler == "normal":
            return hp.qnormal(label, domain.mean, domain.sd, q) if q else \
                hp.normal(label, domain.mean, domain.sd)
        if domain.sampler == "loguniform":
            low, high = np.log(domain.lower), np.log(domain.upper)
            return hp.qloguniform(label, low, high, q) if q else hp.loguniform(label, low, high)
        return hp.quniform(label, domain.lower, domain.upper, q) if q else \
            hp.uniform(label, domain.lower, domain.upper)
    if isinstance(domain, sp.Integer):
        if q is None:  # upper is exclusive
            low, high, q = domain.lower, domain.upper - 1, 1
        else:
            low, high = -(-domain.lower // q) * q, (domain.upper // q) * q
        if domain.sampler == "loguniform":
            return scope.int(hp.qloguniform(label, np.log(low), np.log(high), q))
        return scope.int(hp.quniform(label, low, high, q))
    raise ValueError(f"HyperOptSearch can't translate {domain!r} (at '{label}')")


def _has_param(node: Apply) -> bool:
    return node.name == "hyperopt_param" or any(_has_param(c) for c in node.inputs())


def _assign(node: Apply, value: Any, vals: dict[str, Any], strict: bool = False) -> bool:
    """Fill ``vals`` (label -> HyperOpt value, a choice's index) so that the space ``node``
    evaluates to ``value``; False if it can't. Outside a choice a dict's constants may be
    left out of ``value``; inside one (``strict``) the keys tell the branches apart."""
    name = node.name
    if name == "literal":
        return bool(node.obj == value)
    if name == "hyperopt_param":
        vals[node.pos_args[0].obj] = value
        return True
    if name in ("float", "int"):
        return _assign(node.pos_args[0], value, vals, strict)
    if name == "dict":
        if not isinstance(value, Mapping):
            return False
        if strict and set(value) != {k for k, _ in node.named_args}:
            return False
        for key, child in node.named_args:
            if key not in value:
                if _has_param(child):
                    return False
                continue
            if not _assign(child, value[key], vals, strict):
                return False
        return True
    if name == "pos_args":
        if not isinstance(value, Sequence) or len(value) != len(node.pos_args):
            return False
        return all(_assign(c, v, vals, strict) for c, v in zip(node.pos_args, value))
    if name == "switch":
        label = node.pos_args[0].pos_args[0].obj
        for i, option in enumerate(node.pos_args[1:]):
            branch: dict[str, Any] = {}
            if _assign(option, value, branch, strict=True):
                vals[label] = i
                vals.update(branch)
                return True
        return False
    return False
