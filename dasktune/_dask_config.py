"""Registers dasktune's defaults in ``dask.config`` (the ``dasktune:`` section).

Users override them like any Dask setting: a YAML file in ``~/.config/dask/``,
``DASK_DASKTUNE__EXECUTOR__POLL_WAIT=0.1s``, or ``dask.config.set``.
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


def get(key: str, default: object = None) -> object:
    """``dask.config.get("dasktune." + key)``; an unset (None) value falls back to the
    packaged default, so ``dask.config.set({key: None})`` cannot break dasktune."""
    value = dask.config.get(f"dasktune.{key}", None)
    if value is None:
        value = _default(key)
    return default if value is None else value


def get_seconds(key: str) -> float:
    """A duration setting in seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key), default="s"))
