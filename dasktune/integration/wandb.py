"""Weights & Biases: :class:`WandbLoggerCallback` logs every trial as a W&B run from the
driver; :func:`setup_wandb` starts a run inside a trial (Ray's
``ray.air.integrations.wandb``, same names and arguments).

W&B allows several live runs in one process (``reinit="create_new"``), so where Ray
starts a logging actor per trial, dasktune keeps each trial's run in the driver and
makes every W&B call on the logger's own thread (W&B's ``init`` takes seconds). A
run of :func:`setup_wandb` ends with the trial's attempt.
"""

from __future__ import annotations

import json
import numbers
import os
import pickle
import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import wandb
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('dasktune.integration.wandb needs W&B: '
                      'pip install "dasktune[wandb]"') from exc

from dasktune.integration._background import BackgroundLogger
from dasktune.logger import flatten_dict
from dasktune.session import at_attempt_end, get_context

if TYPE_CHECKING:
    from dasktune.trial import Trial

WANDB_ENV_VAR = "WANDB_API_KEY"
WANDB_PROJECT_ENV_VAR = "WANDB_PROJECT_NAME"
WANDB_GROUP_ENV_VAR = "WANDB_GROUP_NAME"
WANDB_MODE_ENV_VAR = "WANDB_MODE"
DEFAULT_SYNC_TIMEOUT = 1800  # seconds the experiment's end waits for uploads (Ray's)


def _set_api_key(api_key_file: str | None = None, api_key: str | None = None) -> None:
    """Ray's order: the key file, the key, ``WANDB_API_KEY``, then W&B's own login
    (``wandb login``); nothing is needed offline or disabled."""
    if os.environ.get(WANDB_MODE_ENV_VAR) in {"offline", "disabled"}:
        return
    if api_key_file:
        if api_key:
            raise ValueError("pass api_key or api_key_file, not both")
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ[WANDB_ENV_VAR] = api_key


def _project(project: str | None) -> str | None:
    return project or os.environ.get(WANDB_PROJECT_ENV_VAR)


def _is_allowed_type(obj: Any) -> bool:
    """What ``wandb.log`` takes as a value: numbers, W&B media, one-element arrays."""
    if isinstance(obj, np.ndarray) and obj.size == 1:
        return isinstance(obj.item(), numbers.Number)
    if isinstance(obj, Sequence) and not isinstance(obj, str) and len(obj) > 0:
        return isinstance(obj[0], (wandb.Image, wandb.Video, wandb.data_types.WBValue))
    return isinstance(obj, (numbers.Number, wandb.data_types.WBValue))


def _clean_log(obj: Any, *, video_kwargs: dict[str, Any] | None = None,
               image_kwargs: dict[str, Any] | None = None) -> Any:
    """Values W&B can take: 3-d/4-d arrays as images, 5-d as videos, other objects as
    themselves when JSON- and pickle-able, else as a number or text (as Ray does)."""
    video_kwargs, image_kwargs = video_kwargs or {}, image_kwargs or {}

    def clean(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, set)):
            return [clean(v) for v in o]
        if isinstance(o, tuple):
            return tuple(clean(v) for v in o)
        if isinstance(o, np.ndarray) and o.ndim in (3, 4, 5):
            make = (lambda a: wandb.Video(a, **video_kwargs)) if o.ndim == 5 else \
                (lambda a: wandb.Image(a, **image_kwargs))
            if o.ndim == 3:
                return make(o)
            return [make(v) for v in o] if o.shape[0] > 1 else make(o[0])
        if _is_allowed_type(o):
            return o
        try:
            json.dumps(o)
            pickle.dumps(o)
            return o
        except Exception:  # noqa: BLE001 - anything else is logged as its text
            text = str(o)
            for kind in (int, float):
                try:
                    return kind(text)
                except ValueError:
                    pass
            return text

    return clean(obj)


def setup_wandb(config: dict[str, Any] | None = None, api_key: str | None = None,
                api_key_file: str | None = None, rank_zero_only: bool = True,
                **kwargs: Any) -> Any:
    """Start a W&B run for this trial and return it (``run.log({...})``).

    In a trial the run's ID is the trial ID, its name the trial name and its group
    the experiment name; ``kwargs`` go to ``wandb.init`` and take precedence (e.g.
    ``project=``, ``mode="offline"``). ``config`` is logged as the run's config. The
    run ends with the trial's attempt. ``rank_zero_only`` is accepted for Ray
    compatibility (trials have one worker, rank 0).
    """
    del rank_zero_only
    context = get_context()
    try:
        defaults: dict[str, Any] = {"id": context.get_trial_id(),
                                    "name": context.get_trial_name(),
                                    "group": context.get_experiment_name()}
        in_trial = True
    except RuntimeError:
        defaults, in_trial = {}, False
    _set_api_key(api_key_file, api_key)
    init = {**defaults, "resume": "allow", "reinit": "create_new", "allow_val_change": True,
            "config": _clean_log(dict(config or {})),
            "project": _project(kwargs.pop("project", None)),
            "group": kwargs.pop("group", None) or defaults.get("group")
            or os.environ.get(WANDB_GROUP_ENV_VAR)}
    init.update(kwargs)
    run = wandb.init(**init)
    if in_trial:
        at_attempt_end(lambda failed: run.finish(exit_code=1 if failed else 0))
    return run


class WandbLoggerCallback(BackgroundLogger):
    """Log each trial as a W&B run: its config as the run's config, every result's
    values with ``wandb.log`` (step: ``training_iteration``), Ray's
    :attr:`AUTO_CONFIG_KEYS` into the config, checkpoints as artifacts
    (``upload_checkpoints``, local storage).

    Args:
        project: the W&B project (or ``WANDB_PROJECT_NAME``); required.
        group: the W&B group (or ``WANDB_GROUP_NAME``); default the experiment's name.
        api_key_file, api_key: W&B credentials (not needed offline).
        excludes: result and config keys not to log.
        log_config: also log the result's ``config`` (useful when PBT changes it).
        upload_checkpoints: upload each committed checkpoint as a ``model`` artifact.
        save_checkpoints: deprecated alias of ``upload_checkpoints``.
        upload_timeout: seconds the experiment's end waits for pending uploads.
        video_kwargs, image_kwargs: passed to ``wandb.Video`` / ``wandb.Image`` for
            arrays logged as videos (5-d) and images (3-d, 4-d).
        **kwargs: passed to ``wandb.init``.
    """

    service = "wandb"
    _exclude_results = ["done", "should_checkpoint"]
    AUTO_CONFIG_KEYS = ["trial_id", "experiment_tag", "node_ip", "experiment_id",
                        "hostname", "pid", "date"]

    def __init__(self, project: str | None = None, group: str | None = None,
                 api_key_file: str | None = None, api_key: str | None = None,
                 excludes: list[str] | None = None, log_config: bool = False,
                 upload_checkpoints: bool = False, save_checkpoints: bool = False,
                 upload_timeout: int = DEFAULT_SYNC_TIMEOUT,
                 video_kwargs: dict[str, Any] | None = None,
                 image_kwargs: dict[str, Any] | None = None, **kwargs: Any):
        if save_checkpoints:
            warnings.warn("`save_checkpoints` is deprecated. Use `upload_checkpoints`.",
                          DeprecationWarning, stacklevel=2)
            upload_checkpoints = True
        self.project = project
        self.group = group
        self.api_key_path = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints
        self.timeout = float(upload_timeout)
        self.video_kwargs = video_kwargs or {}
        self.image_kwargs = image_kwargs or {}
        self.kwargs = kwargs
        self._runs: dict[str, Any] = {}  # trial_id -> wandb Run (on the logger's thread)
        self._started: set[str] = set()

    def setup(self, *args: Any, **info: Any) -> None:
        super().setup(*args, **info)
        _set_api_key(self.api_key_path, self.api_key)
        self.project = _project(self.project)
        if not self.project:
            raise ValueError("WandbLoggerCallback: pass project= or set the "
                             f"{WANDB_PROJECT_ENV_VAR} environment variable")
        self.group = self.group or os.environ.get(WANDB_GROUP_ENV_VAR)

    # ------------------------------------------------------- driver side (quick)
    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self._started:  # a restarted trial goes on in its run
            return
        self._started.add(trial.trial_id)
        config = {k: v for k, v in trial.config.items()
                  if k != "callbacks" and k not in self.excludes}
        init = {"id": trial.trial_id, "name": str(trial), "resume": "allow",
                "reinit": "create_new", "allow_val_change": True, "project": self.project,
                "group": self.group or (self.storage.name if self.storage else None),
                "config": config}
        if self.storage is not None and self.storage.is_local and trial.path:
            init["dir"] = trial.path  # as Ray: the run's files in the trial's folder
        init.update(self.kwargs)
        self.submit(self._init, trial.trial_id, init)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._started:
            self.log_trial_start(trial)
        self.submit(self._log, trial.trial_id, dict(result))

    def log_trial_save(self, trial: Trial) -> None:
        if self.upload_checkpoints and trial.checkpoint and self.storage is not None \
                and self.storage.is_local:
            self.submit(self._upload, trial.trial_id, str(trial), trial.checkpoint)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._started.discard(trial.trial_id)
        self.submit(self._finish, trial.trial_id, 1 if failed else 0)

    # ------------------------------------------------------ the logger's thread
    def _init(self, trial_id: str, init: dict[str, Any]) -> None:
        if "dir" in init:
            os.makedirs(init["dir"], exist_ok=True)
        init["config"] = _clean_log(init["config"])
        self._runs[trial_id] = wandb.init(**init)

    def _split(self, result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A result as (values to log, config updates), as Ray splits it."""
        result = _clean_log(result, video_kwargs=self.video_kwargs,
                            image_kwargs=self.image_kwargs)
        excluded = set(self._exclude_results) | set(self.excludes)
        if not self.log_config:
            excluded.add("config")
        config_update = dict(result.get("config") or {}) if self.log_config else {}
        log = {}
        for key, value in flatten_dict(result, delimiter="/").items():
            if any(key == item or key.startswith(item + "/") for item in excluded):
                continue
            if any(key == item or key.startswith(item + "/") for item in self.AUTO_CONFIG_KEYS):
                config_update[key] = value
            elif _is_allowed_type(value):
                log[key] = value
        config_update.pop("callbacks", None)
        return log, config_update

    def _log(self, trial_id: str, result: dict[str, Any]) -> None:
        run = self._runs.get(trial_id)
        if run is None:
            return
        log, config_update = self._split(result)
        if config_update:
            run.config.update(config_update, allow_val_change=True)
        run.log(log, step=result.get("training_iteration"))

    def _upload(self, trial_id: str, name: str, checkpoint_path: str) -> None:
        run = self._runs.get(trial_id)
        if run is None:
            return
        # W&B takes letters, digits, "-", "_" and "." in an artifact's name
        safe = re.sub(r"[^\w.-]", "_", name)
        artifact = wandb.Artifact(name=f"checkpoint_{safe}", type="model")
        artifact.add_dir(checkpoint_path)
        run.log_artifact(artifact)

    def _finish(self, trial_id: str, exit_code: int) -> None:
        run = self._runs.pop(trial_id, None)
        if run is not None:
            run.finish(exit_code=exit_code)


__all__ = ["WandbLoggerCallback", "setup_wandb"]
