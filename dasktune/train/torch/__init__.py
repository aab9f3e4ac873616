"""Ray's ``ray.train.torch``: :class:`TorchTrainer` and the loop helpers."""

from __future__ import annotations

from dasktune.train.torch.torch_trainer import TorchConfig, TorchTrainer
from dasktune.train.torch.train_loop_utils import (
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)

__all__ = ["TorchConfig", "TorchTrainer", "get_device", "get_devices", "prepare_data_loader",
           "prepare_model"]
