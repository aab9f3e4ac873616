"""Registers dasktune's defaults in ``dask.config`` (the ``dasktune:`` section).

Users override them like any Dask setting: a YAML file in ``~/.config/dask/``,
``DASK_DASKTUNE__EXECUTOR__POLL_WAIT=0.1s``, or ``dask.config.set``. Every dasktune knob
is read through :func:`get`; the one environment variable of Ray's that still works,
``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``, is read here too, as ``default-loggers: false``.
"""

from __future__ import annotations

import os

import dask.config
import yaml

_FN = os.path.join(os.path.dirname(__file__), "dasktune.yaml")

with open(_FN) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def _default(key: str) -> object:
    node: object = _defaults["dasktune"]
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# Ray's documented environment variables kept as aliases: setting key -> (variable,
# the setting's value for the variable's value).
_RAY_ALIASES = {
    "default-loggers": ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", lambda raw: raw.strip() != "1"),
}


def get(key: str, default: object = None) -> object:
    """``dask.config.get("dasktune." + key)``; an unset (None) value falls back to the
    packaged default, so ``dask.config.set({key: None})`` cannot break dasktune. A Ray
    environment variable aliasing the key wins when it is set (Ray reads it each run)."""
    alias = _RAY_ALIASES.get(key)
    if alias is not None and os.environ.get(alias[0]) is not None:
        return alias[1](os.environ[alias[0]])
    value = dask.config.get(f"dasktune.{key}", None)
    if value is None:
        value = _default(key)
    return default if value is None else value


def get_seconds(key: str) -> float:
    """A duration setting in seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key), default="s"))
