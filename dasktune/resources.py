"""What a host offers and what a trial asks for, in Dask resource tags.

Ray spells resources ``cpu``/``gpu``/``memory`` (or ``CPU``/``GPU``); Dask workers advertise
arbitrary tags (``dask worker --resources "CPU=8 GPU=2"``) that tasks consume. This module is
the one translation between the two, plus host detection for ``dasktune worker`` and the
per-worker ledger that hands trials concrete GPU devices.

Detection never raises: a host without NVML, ``nvidia-smi`` or GPUs simply has no GPUs.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from numbers import Real

logger = logging.getLogger(__name__)

__all__ = [
    "GPUAllocator",
    "GPUInfo",
    "accelerator_type",
    "canonical_key",
    "detect_gpus",
    "detect_resources",
    "format_resources",
    "normalize_request",
    "parse_visible_devices",
    "worker_capacity",
    "worker_devices",
]

# Ray's spelling -> Dask resource tag. Anything else is a custom tag, passed through unchanged.
_ALIASES = {"cpu": "CPU", "CPU": "CPU", "gpu": "GPU", "GPU": "GPU", "memory": "memory"}
# Float slack so that e.g. ten 0.1-GPU trials fit on one device.
_EPS = 1e-9
_NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML / ``nvidia-smi`` report it.

    ``index`` is the NVML (PCI bus order) index, ``memory_total`` is in bytes.
    """

    index: int
    name: str
    uuid: str
    memory_total: int
    pci_bus_id: str

    @property
    def device_id(self) -> str:
        """The value to put in ``CUDA_VISIBLE_DEVICES`` for this GPU (UUID when known).

        UUIDs are immune to CUDA enumerating devices in a different order than NVML does.
        """
        return self.uuid or str(self.index)


# ---------------------------------------------------------------------------------------------
# Detection


def _decode(value: object) -> str:
    # Older pynvml releases return bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpus_from_nvml() -> list[GPUInfo] | None:
    """All GPUs via NVML, or None when NVML is unusable here."""
    try:
        import pynvml
    except ImportError:
        logger.debug("pynvml is not importable; trying nvidia-smi")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        logger.debug("NVML could not be initialised (%s); trying nvidia-smi", e)
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                GPUInfo(
                    index=i,
                    name=_decode(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_decode(pynvml.nvmlDeviceGetUUID(handle)),
                    memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    pci_bus_id=_decode(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                )
            )
        return gpus
    except Exception as e:  # noqa: BLE001 - any NVML failure means "ask nvidia-smi"
        logger.debug("NVML query failed (%s); trying nvidia-smi", e)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001 - shutting down must not hide the result
            logger.debug("nvmlShutdown failed: %s", e)


def _gpus_from_nvidia_smi() -> list[GPUInfo] | None:
    """All GPUs via ``nvidia-smi``, or None when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        logger.debug("nvidia-smi is not on PATH")
        return None
    cmd = [
        exe,
        "--query-gpu=index,name,uuid,memory.total,pci.bus_id",
        "--format=csv,noheader,nounits",
    ]
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        logger.debug("nvidia-smi failed: %s", e)
        return None
    gpus = []
    for row in csv.reader(out.splitlines(), skipinitialspace=True):
        if not row:
            continue
        try:
            index, name, uuid, mem_mib, bus_id = (field.strip() for field in row)
            # nounits: memory.total is in MiB.
            gpus.append(GPUInfo(int(index), name, uuid, int(float(mem_mib)) * 2**20, bus_id))
        except ValueError:
            logger.debug("Ignoring unparsable nvidia-smi line %r", row)
    return gpus


def parse_visible_devices(value: str | None) -> list[str] | None:
    """Split a ``CUDA_VISIBLE_DEVICES`` value into device tokens.

    None means "not set" (all devices visible); ``""`` or ``-1`` means none.
    """
    if value is None:
        return None
    tokens = []
    for token in value.split(","):
        token = token.strip()
        if not token or token == "-1":
            # CUDA stops enumerating at the first invalid entry.
            break
        tokens.append(token)
    return tokens


def _restrict_to_visible(gpus: list[GPUInfo], visible: list[str]) -> list[GPUInfo]:
    """The GPUs named by ``CUDA_VISIBLE_DEVICES`` tokens, in that (CUDA ordinal) order.

    Index tokens are matched against NVML indices, which equal CUDA's only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or on hosts with identical GPUs); UUID tokens may be
    unique prefixes, as CUDA allows.
    """
    chosen: list[GPUInfo] = []
    for token in visible:
        if token.isdigit():
            match = [g for g in gpus if g.index == int(token)]
        else:
            match = [g for g in gpus if g.uuid and g.uuid.startswith(token)]
        if len(match) != 1:
            logger.debug("CUDA_VISIBLE_DEVICES entry %r matches no single GPU; stopping", token)
            break
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def detect_gpus() -> list[GPUInfo]:
    """The GPUs this process may use: NVML, else ``nvidia-smi``, else none.

    Honours an existing ``CUDA_VISIBLE_DEVICES``. Never raises.
    """
    try:
        gpus = _gpus_from_nvml()
        if gpus is None:
            gpus = _gpus_from_nvidia_smi()
        if not gpus:
            return []
        visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return gpus if visible is None else _restrict_to_visible(gpus, visible)
    except Exception as e:  # noqa: BLE001 - advisory: a broken driver means "no GPUs"
        logger.debug("GPU detection failed: %s", e)
        return []


def accelerator_type(name: str) -> str:
    """A short, tag-safe model name, like Ray's: ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``."""
    words = [w for w in name.split() if w not in {"NVIDIA", "Tesla", "GeForce", "Quadro"}]
    if not words:
        return "GPU"
    model = words[0].split("-")[0]
    if model in {"RTX", "GTX"} and len(words) > 1:  # "RTX 3090", "RTX A6000"
        model = f"{model}_{words[1].split('-')[0]}"
    # Keep it usable inside ``dask worker --resources "k=v,k=v"``.
    return re.sub(r"[^A-Za-z0-9_.]", "_", model)


def detect_resources(gpus: Sequence[GPUInfo] | None = None) -> dict[str, float]:
    """What this host offers as Dask resource tags.

    ``{"CPU": usable cores, "GPU": visible GPUs, "memory": bytes}`` plus
    ``accelerator_type:<MODEL>: 1`` per GPU model present, as Ray does. CPUs respect CPU
    affinity and cgroup quotas; memory respects cgroup and RSS limits. Pass ``gpus`` to skip
    GPU detection.
    """
    from dask.system import cpu_count
    from distributed.system import memory_limit

    if gpus is None:
        gpus = detect_gpus()
    res: dict[str, float] = {
        "CPU": float(cpu_count()),
        "GPU": float(len(gpus)),
        "memory": float(memory_limit()),
    }
    for gpu in gpus:
        res[f"accelerator_type:{accelerator_type(gpu.name)}"] = 1.0
    return res


# ---------------------------------------------------------------------------------------------
# Requests and capacity


def _amount(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        # ValueError, not TypeError: callers catch one error type for any bad request.
        raise ValueError(f"Resource {key!r} must be a number, got {value!r}")  # noqa: TRY004
    amount = float(value)
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"Resource {key!r} must be a finite number >= 0, got {value!r}")
    return amount


def canonical_key(key: object) -> str:
    """The Dask tag for a Ray resource name (``cpu`` -> ``CPU``); custom names unchanged."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"Resource names must be non-empty strings, got {key!r}")
    return _ALIASES.get(key, key)


def normalize_request(resources: Mapping[str, object] | None) -> dict[str, float]:
    """A trial's resource request in Ray's spelling -> Dask resource tags.

    ``{"cpu": 2, "gpu": 0.5, "memory": 4e9, "custom": 1}`` ->
    ``{"CPU": 2.0, "GPU": 0.5, "memory": 4e9, "custom": 1.0}``. CPU defaults to 1, GPU to 0.
    Zero amounts are dropped, except ``CPU`` (a zero-CPU trial is valid). Fractional GPUs
    must be below 1, as in Ray.

    Raises:
        TypeError: ``resources`` is not a mapping.
        ValueError: an amount is not a number, negative, or a fractional GPU above 1, or a
            name is given twice (``cpu`` and ``CPU``); the message names the key.
    """
    if resources is None:
        resources = {}
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources must be a dict, got {type(resources).__name__}")
    out: dict[str, float] = {}
    for key, value in resources.items():
        tag = canonical_key(key)
        if tag in out:
            raise ValueError(f"Resource {key!r} given twice (as {tag!r})")
        out[tag] = _amount(key, value)
    gpu = out.get("GPU", 0.0)
    if gpu > 1 and not float(gpu).is_integer():
        raise ValueError(f"Resource 'GPU' must be a whole number when above 1, got {gpu:g}")
    out.setdefault("CPU", 1.0)
    # Stable, readable order: CPU, GPU, memory, then custom tags as given.
    ordered = {k: out.pop(k) for k in ("CPU", "GPU", "memory") if k in out}
    ordered.update(out)
    return {k: v for k, v in ordered.items() if v > 0 or k == "CPU"}


def worker_capacity(worker_info: Mapping[str, object]) -> dict[str, float]:
    """The resources one Dask worker offers.

    ``worker_info`` is an entry of ``client.scheduler_info()["workers"]``. Its advertised
    ``resources``, with ``CPU`` defaulting to ``nthreads`` and ``memory`` to
    ``memory_limit`` (when it has one) for workers started without those tags.
    """
    cap = {str(k): float(v) for k, v in dict(worker_info.get("resources") or {}).items()}
    if "CPU" not in cap and worker_info.get("nthreads"):
        cap["CPU"] = float(worker_info["nthreads"])
    if "memory" not in cap and worker_info.get("memory_limit"):
        cap["memory"] = float(worker_info["memory_limit"])
    return cap


def format_resources(resources: Mapping[str, float]) -> str:
    """``{"CPU": 2.0, "GPU": 1.0}`` -> ``"CPU=2, GPU=1"``, memory in readable bytes."""
    from dask.utils import format_bytes

    parts = []
    for key, value in resources.items():
        if key == "memory":
            text = format_bytes(int(value))
        elif float(value).is_integer():
            text = str(int(value))
        else:
            text = f"{value:g}"
        parts.append(f"{key}={text}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Device assignment


def worker_devices(gpus: float, cuda_visible_devices: str | None = None) -> list[str]:
    """The device tokens a worker with ``GPU=gpus`` can hand to its trials.

    The worker's own ``CUDA_VISIBLE_DEVICES`` entries when it has any (so a trial's
    subprocess sees the same physical devices), else ``"0"``, ``"1"``, ... one per
    advertised GPU.
    """
    visible = parse_visible_devices(cuda_visible_devices)
    if visible:
        return visible
    return [str(i) for i in range(int(gpus))]


class GPUAllocator:
    """Per-worker ledger of which trial uses which GPU device.

    Whole-GPU requests get that many distinct, entirely free devices; a fractional request
    (below 1) shares one device whose unused fraction fits, packing onto the fullest such
    device so that whole devices stay free for whole-GPU trials. Dask's resource
    accounting decides *whether* a trial runs on a worker; this decides *which* devices
    it sets in ``CUDA_VISIBLE_DEVICES``.

    Thread-safe: trials on one worker may allocate and release concurrently.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[str, float] = {}  # device -> fraction in use
        self._held: dict[str, dict[str, float]] = {}  # trial -> {device: fraction}

    def allocate(self, trial_id: str, gpus: float, devices: Sequence[str]) -> list[str] | None:
        """Reserve ``gpus`` GPUs among ``devices`` for ``trial_id``.

        Returns the chosen device tokens (``[]`` for ``gpus == 0``), or None when the
        request does not fit now.

        Raises:
            ValueError: ``gpus`` is negative or a non-integer above 1, or ``trial_id``
                already holds devices.
        """
        amount = _amount("GPU", gpus)
        if amount > 1 and not amount.is_integer():
            raise ValueError(f"Resource 'GPU' must be a whole number when above 1, got {gpus}")
        with self._lock:
            if trial_id in self._held:
                raise ValueError(f"Trial {trial_id!r} already holds GPUs; release it first")
            if amount == 0:
                chosen: dict[str, float] = {}
            elif amount >= 1:
                free = [d for d in dict.fromkeys(devices) if self._used.get(d, 0.0) <= _EPS]
                if len(free) < amount:
                    return None
                chosen = {d: 1.0 for d in free[: int(amount)]}
            else:
                fits = [
                    d
                    for d in dict.fromkeys(devices)
                    if 1.0 - self._used.get(d, 0.0) >= amount - _EPS
                ]
                if not fits:
                    return None
                # Fullest fitting device first; ties by the worker's device order.
                best = max(fits, key=lambda d: self._used.get(d, 0.0))
                chosen = {best: amount}
            for d, frac in chosen.items():
                self._used[d] = self._used.get(d, 0.0) + frac
            self._held[trial_id] = chosen
            return list(chosen)

    def release(self, trial_id: str) -> None:
        """Free what ``trial_id`` holds; a no-op for unknown trials (release is idempotent)."""
        with self._lock:
            for d, frac in self._held.pop(trial_id, {}).items():
                left = self._used.get(d, 0.0) - frac
                if left <= _EPS:
                    self._used.pop(d, None)
                else:
                    self._used[d] = left

    def in_use(self) -> dict[str, float]:
        """Fraction in use per device (devices with nothing allocated are absent)."""
        with self._lock:
            return dict(self._used)

    def holdings(self, trial_id: str) -> list[str]:
        """The devices ``trial_id`` holds (``[]`` if none)."""
        with self._lock:
            return list(self._held.get(trial_id, {}))
