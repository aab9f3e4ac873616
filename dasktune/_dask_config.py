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


def get(key: str) -> object:
    """``dask.config.get("dasktune." + key)``."""
    return dask.config.get(f"dasktune.{key}")


def get_seconds(key: str) -> float:
    """A duration setting in seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key), default="s"))
