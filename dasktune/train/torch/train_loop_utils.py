"""``prepare_model``, ``prepare_data_loader``, ``get_device``, ``enable_reproducibility``:
the same training loop on one rank or many, CPU or GPU (Ray's ``ray.train.torch``
helpers).

Each rank's process sees exactly its own GPUs (``CUDA_VISIBLE_DEVICES``), so its device
is ``cuda:0``; without GPUs it is the CPU. ``torch`` is imported lazily: the rest of
``dasktune.train`` works without it.
"""

from __future__ import annotations

import os
import random
from typing import Any

from dasktune.train import context

__all__ = ["enable_reproducibility", "get_device", "get_devices", "prepare_data_loader",
           "prepare_model"]


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError('dasktune.train.torch needs PyTorch: pip install "dasktune[torch]"'
                          ) from None
    return torch


def _world_size() -> int:
    try:
        return context.get_context().get_world_size()
    except RuntimeError:  # outside a trainer: one process
        return 1


def get_devices() -> list[Any]:
    """Every device this rank may use: its GPUs, else the CPU."""
    torch = _torch()
    if torch.cuda.is_available() and torch.cuda.device_count():
        return [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


def get_device() -> Any:
    """This rank's device: its first GPU (``cuda:0``), else the CPU."""
    return get_devices()[0]


def enable_reproducibility(seed: int = 0) -> None:
    """Limit the sources of run-to-run differences in this process, as Ray's does: seed
    torch, Python's ``random`` and NumPy with ``seed``, make torch use deterministic
    algorithms (an operation that has none then raises) and cuDNN stop benchmarking
    convolutions, and set ``CUBLAS_WORKSPACE_CONFIG`` (CUDA's deterministic matmuls need
    it). Call it first thing in ``train_loop_per_worker``; results can still differ
    across machines and library versions (PyTorch's notes on randomness)."""
    torch = _torch()
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # torch runs without NumPy: nothing of it to seed
        pass
    else:
        numpy.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def prepare_model(model: Any, move_to_device: bool | Any = True,
                  parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None) -> Any:
    """Move ``model`` to this rank's device (``move_to_device``: True, or a device) and,
    with more than one rank, wrap it in ``DistributedDataParallel`` (``"ddp"``) or
    ``FullyShardedDataParallel`` (``"fsdp"``); ``parallel_strategy=None`` wraps nothing."""
    torch = _torch()
    if parallel_strategy not in ("ddp", "fsdp", None):
        raise ValueError(f"prepare_model: parallel_strategy must be 'ddp', 'fsdp' or None, "
                         f"got {parallel_strategy!r}")
    device = get_device() if move_to_device is True else move_to_device
    if move_to_device is not False:
        model = model.to(device)
    if parallel_strategy is None or _world_size() < 2:
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    if parallel_strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, **kwargs)
    from torch.nn.parallel import DistributedDataParallel

    on_gpu = isinstance(device, torch.device) and device.type == "cuda"
    if on_gpu:
        kwargs.setdefault("device_ids", [device])
        kwargs.setdefault("output_device", device)
    return DistributedDataParallel(model, **kwargs)


def prepare_data_loader(data_loader: Any, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True) -> Any:
    """With more than one rank, a copy of ``data_loader`` whose sampler gives each rank
    its own share (``DistributedSampler``, shuffling if the original shuffled; call
    ``loader.sampler.set_epoch(epoch)`` each epoch, as with plain torch); with
    ``move_to_device``, its batches arrive on this rank's device."""
    torch = _torch()
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    if add_dist_sampler and _world_size() > 1 and \
            not isinstance(data_loader.sampler, DistributedSampler):
        shuffle = isinstance(data_loader.sampler, RandomSampler)
        data_loader = DataLoader(
            data_loader.dataset, batch_size=data_loader.batch_size,
            sampler=DistributedSampler(data_loader.dataset, shuffle=shuffle),
            num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory, drop_last=data_loader.drop_last,
            timeout=data_loader.timeout, worker_init_fn=data_loader.worker_init_fn,
            generator=data_loader.generator,
            persistent_workers=data_loader.persistent_workers)
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceLoader(data_loader, device, auto_transfer and torch.cuda.is_available())
    return data_loader


class _DeviceLoader:
    """A data loader whose batches (tensors, or lists/tuples/dicts of them) are moved
    to ``device``; everything else is the wrapped loader's."""

    def __init__(self, loader: Any, device: Any, non_blocking: bool):
        self._loader, self._device, self._non_blocking = loader, device, non_blocking

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def _move(self, item: Any) -> Any:
        if hasattr(item, "to"):
            return item.to(self._device, non_blocking=self._non_blocking)
        if isinstance(item, (list, tuple)):
            return type(item)(self._move(i) for i in item)
        if isinstance(item, dict):
            return {k: self._move(v) for k, v in item.items()}
        return item

    def __iter__(self) -> Any:
        for batch in self._loader:
            yield self._move(batch)
