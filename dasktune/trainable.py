"""The class API (``tune.Trainable``) and the wrappers ``with_parameters`` / ``with_resources``.

A trainable is either a function ``f(config)`` that calls ``tune.report`` or a
:class:`Trainable` subclass. Both run on a worker inside a trial actor
(``actor.py``); this module only defines what the user subclasses and wraps.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import pickle
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any

from dasktune.result import DEFAULT_METRIC, fill_auto_fields
from dasktune.session import node_ip

RESULT_DUPLICATE = "__duplicate__"
_DICT_CHECKPOINT_FILE = "dict_checkpoint.pkl"


class Trainable:
    """Ray Tune's class API: override ``setup``, ``step``, ``save_checkpoint``,
    ``load_checkpoint`` and optionally ``cleanup`` and ``reset_config``.

    ``step()`` returns a dict of metrics; returning ``{"done": True, ...}`` ends the
    trial, and ``dasktune.result.SHOULD_CHECKPOINT: True`` asks for a checkpoint.
    ``save_checkpoint(checkpoint_dir)`` writes files into ``checkpoint_dir`` (or returns
    a dict, which is pickled there); ``load_checkpoint`` receives the same directory
    (or that dict) back on restore.
    """

    def __init__(self, config: dict[str, Any] | None = None, logger_creator: Any = None,
                 storage: Any = None, *, trial_info: dict[str, Any] | None = None):
        info = trial_info or {}
        self.config: dict[str, Any] = config or {}
        self._trial_id: str = info.get("trial_id", "default")
        self._trial_name: str = info.get("trial_name", "default")
        self._logdir: str = info.get("logdir") or tempfile.mkdtemp(prefix="dasktune-trainable-")
        self._trial_resources: dict[str, Any] = info.get("resources", {})
        self._iteration = int(info.get("iteration", 0))
        self._time_total = float(info.get("time_total_s", 0.0))
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self._restored = False
        self.setup(copy.deepcopy(self.config), **(info.get("params") or {}))

    # ------------------------------------------------------------ attributes
    @property
    def iteration(self) -> int:
        """Iterations run so far, across restores (Ray's ``iteration``)."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        """How many times ``step`` has returned."""
        return self._iteration

    @property
    def trial_id(self) -> str:
        """The trial's id."""
        return self._trial_id

    @property
    def trial_name(self) -> str:
        """The trial's name."""
        return self._trial_name

    @property
    def logdir(self) -> str:
        """The trial's local working folder."""
        return self._logdir

    @property
    def trial_resources(self) -> dict[str, Any]:
        """The resources the trial was started with."""
        return self._trial_resources

    # ------------------------------------------------------------ user hooks
    def setup(self, config: dict[str, Any]) -> None:
        """Called once with the trial's config, before the first step."""

    def step(self) -> dict[str, Any]:
        """One unit of training; returns a dict of metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """Write the trainable's state into ``checkpoint_dir`` (or return a dict)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement save_checkpoint(); it cannot be "
            "checkpointed (needed for checkpoint_frequency, PBT, pausing and graceful moves)"
        )

    def load_checkpoint(self, checkpoint: str | dict[str, Any]) -> None:
        """Restore state written by :meth:`save_checkpoint`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement load_checkpoint()")

    def cleanup(self) -> None:
        """Called once when the trial's attempt ends."""

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Reuse this instance for ``new_config``; return True if supported."""
        return False

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> dict[str, float] | None:
        """Resources a trial of this class needs (overridden by ``with_resources``)."""
        return None

    # ------------------------------------------------------------ framework
    def train(self) -> dict[str, Any]:
        """Run one ``step`` and fill Ray's auto fields into its result.

        Standalone (``T(config).train()``) this is the whole result. Inside a trial the
        session then overwrites the same fields with its own values (kept in step with
        these: it starts at the same restored iteration), so nothing is counted twice.
        """
        start = time.monotonic()
        result = self.step()
        if not isinstance(result, dict):
            raise TypeError(
                f"{type(self).__name__}.step() must return a dict, got {type(result).__name__}"
            )
        result = dict(result)
        # Ray: a step that times itself (time_this_iter_s in its result) is believed.
        elapsed = result.get("time_this_iter_s")
        if elapsed is None:
            elapsed = time.monotonic() - start
        self._iteration += 1
        self._iterations_since_restore += 1
        self._time_total += elapsed
        self._time_since_restore += elapsed
        return fill_auto_fields(
            result,
            training_iteration=self._iteration,
            iterations_since_restore=self._iterations_since_restore,
            time_this_iter_s=elapsed,
            time_total_s=self._time_total,
            time_since_restore=self._time_since_restore,
            timestamp=time.time(),
            trial_id=self._trial_id,
            pid=os.getpid(),
            hostname=_hostname(),
            node_ip=_this_node_ip(),
            config=self.config,
        )

    def save(self, checkpoint_dir: str | None = None) -> str:
        """Write a checkpoint into ``checkpoint_dir`` (a new temp folder if None)."""
        checkpoint_dir = checkpoint_dir or tempfile.mkdtemp(prefix="dasktune-save-")
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = self.save_checkpoint(checkpoint_dir)
        if isinstance(state, dict):
            with open(os.path.join(checkpoint_dir, _DICT_CHECKPOINT_FILE), "wb") as f:
                pickle.dump(state, f)
        elif state is not None and not isinstance(state, str):
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint() must return None, a dict or the "
                f"checkpoint dir, got {type(state).__name__}"
            )
        return checkpoint_dir

    def restore(self, checkpoint_dir: str) -> None:
        """Load a checkpoint directory written by :meth:`save`."""
        if not os.path.isdir(checkpoint_dir):  # else load_checkpoint gets a path to nothing
            raise FileNotFoundError(f"checkpoint folder {checkpoint_dir} does not exist")
        dict_file = os.path.join(checkpoint_dir, _DICT_CHECKPOINT_FILE)
        if os.path.exists(dict_file):
            with open(dict_file, "rb") as f:
                self.load_checkpoint(pickle.load(f))
        else:
            self.load_checkpoint(checkpoint_dir)
        self._restored = True
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0

    def reset(self, new_config: dict[str, Any], trial_info: dict[str, Any] | None = None) -> bool:
        """Take a new trial in this instance (``TuneConfig(reuse_actors=True)``): the
        counters restart and :meth:`reset_config` adopts ``new_config``; False when it
        cannot (the caller then builds a fresh instance)."""
        info = trial_info or {}
        self.config = new_config
        self._trial_id = info.get("trial_id", self._trial_id)
        self._trial_name = info.get("trial_name", self._trial_name)
        self._logdir = info.get("logdir") or self._logdir
        self._trial_resources = info.get("resources", self._trial_resources)
        self._iteration = int(info.get("iteration", 0))
        self._time_total = float(info.get("time_total_s", 0.0))
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self._restored = False
        return bool(self.reset_config(copy.deepcopy(new_config)))

    def stop(self) -> None:
        """Release the trainable's resources (calls ``cleanup``)."""
        self.cleanup()


@functools.cache
def _hostname() -> str:
    return socket.gethostname()


@functools.cache
def _this_node_ip() -> str:
    """This host's IP, looked up once per process (train() runs per step)."""
    return node_ip()


# ------------------------------------------------------------------ wrappers
class _WithParameters:
    """A trainable plus large objects shipped once to the cluster (``with_parameters``)."""

    def __init__(self, trainable: Any, params: dict[str, Any]):
        self.trainable = trainable
        self.params = params
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    def __call__(self, config: dict[str, Any], **params: Any) -> Any:
        return self.trainable(config, **params)


class _WithResources:
    """A trainable with a resource request (``with_resources``)."""

    def __init__(self, trainable: Any, resources: Mapping[str, float] | Callable[..., Any]):
        self.trainable = trainable
        self.resources = resources
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.trainable(*args, **kwargs)


def with_parameters(trainable: Any, **kwargs: Any) -> _WithParameters:
    """Pass large objects to every trial without copying them into each trial's spec.

    The objects are scattered to the cluster once per experiment and fetched once
    per worker process; the trainable receives them as keyword arguments
    (``f(config, data=...)``) or, for a class, as ``setup(config, **kwargs)``.
    """
    if not kwargs:
        raise ValueError("with_parameters() needs at least one keyword argument")
    return _WithParameters(trainable, kwargs)


def with_resources(trainable: Any, resources: Mapping[str, float] | Callable[..., Any]
                   ) -> _WithResources:
    """Ask for resources per trial: ``{"cpu": 2, "gpu": 1}``, custom Dask resource tags,
    a callable ``config -> dict`` for per-trial requests, or an object with
    ``as_placement_group_factory()`` (``dasktune.train.ScalingConfig``): its bundle 0 is
    the trial's own, bundles 1.. the workers reserved with each trial (a gang)."""
    if not (isinstance(resources, Mapping) or callable(resources) or
            hasattr(resources, "as_placement_group_factory")):
        raise TypeError("with_resources: resources must be a dict, a callable config -> dict "
                        "or a ScalingConfig")
    return _WithResources(trainable, resources)


def unwrap(trainable: Any) -> tuple[Any, dict[str, Any], Any]:
    """Split a (possibly wrapped) trainable into (core, params, resources)."""
    params: dict[str, Any] = {}
    resources: Any = None
    while isinstance(trainable, (_WithParameters, _WithResources)):
        if isinstance(trainable, _WithParameters):
            params = {**trainable.params, **params}
        elif resources is None:
            resources = trainable.resources
        trainable = trainable.trainable
    return trainable, params, resources


def run_function(fn: Callable[..., Any], config: dict[str, Any], params: Mapping[str, Any],
                 report: Callable[[dict[str, Any]], None]) -> Any:
    """Call a function trainable; what it returns (or, a generator, yields) is reported as
    Ray 2.60 does: a dict as a result, a number as ``{"_metric": number}``, a falsy value
    (``None``, ``0``, ``{}``) not at all; anything else is a ValueError."""
    def handle(output: Any) -> None:
        if not output:
            return
        if isinstance(output, dict):
            report(output)
        elif isinstance(output, Number):
            report({DEFAULT_METRIC: output})
        else:
            raise ValueError("Invalid return or yield value. Either return/yield a single "
                             "number or a dictionary object in your trainable function.")

    if inspect.isgeneratorfunction(fn):
        output = None
        for output in fn(config, **params):
            handle(output)
        return output
    output = fn(config, **params)
    handle(output)
    return output


def is_class_trainable(trainable: Any) -> bool:
    return inspect.isclass(trainable) and issubclass(trainable, Trainable)


def trainable_name(trainable: Any) -> str:
    core, _, _ = unwrap(trainable)
    if isinstance(core, str):
        return core
    return getattr(core, "__name__", type(core).__name__)


def validate_trainable(trainable: Any) -> None:
    """Type checks at ``Tuner(...)`` time: a callable or a Trainable subclass."""
    core, _, _ = unwrap(trainable)
    if inspect.isclass(core):
        if not issubclass(core, Trainable):
            raise TypeError(
                f"trainable class {core.__name__} must subclass dasktune.Trainable"
            )
        return
    if not callable(core):
        raise TypeError(
            f"trainable must be a function or a dasktune.Trainable subclass, got "
            f"{type(core).__name__} {core!r}"
        )
