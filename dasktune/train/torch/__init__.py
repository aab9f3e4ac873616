"""Ray's ``ray.train.torch``: :class:`TorchTrainer` and the loop helpers.

The trainer (which brings the tuner and Dask's client along) is imported on first use:
a rank's loop imports this package for :func:`prepare_model` and the like, and what a
rank imports is start-up time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dasktune.train.torch.train_loop_utils import (
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)

if TYPE_CHECKING:
    from dasktune.train.torch.torch_trainer import TorchConfig, TorchTrainer

_LAZY = frozenset({"TorchConfig", "TorchTrainer"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dasktune.train.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module("dasktune.train.torch.torch_trainer"), name)
    globals()[name] = value
    return value


__all__ = ["TorchConfig", "TorchTrainer", "enable_reproducibility", "get_device", "get_devices",
           "prepare_data_loader", "prepare_model"]
