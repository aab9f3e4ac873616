"""``dasktune.init`` / ``dasktune.shutdown``: which Dask cluster trials run on.

Resolution order for ``Tuner.fit()``: an active ``distributed.Client``
(``with Client(addr): tuner.fit()``); else the client ``init`` returned; else the
``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``); else an embedded
:class:`distributed.LocalCluster` sized to the machine, started on first use and
closed at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

import dask.config

logger = logging.getLogger(__name__)

# ray.init arguments that mean nothing on Dask; accepted so scripts run unchanged.
_RAY_ONLY = {
    "configure_logging", "logging_level", "logging_format", "log_to_driver", "include_dashboard",
    "dashboard_host", "dashboard_port", "runtime_env", "namespace", "object_store_memory",
    "local_mode", "_temp_dir", "_system_config", "_memory", "storage", "job_config",
    "_node_ip_address", "_redis_password", "ignore_reinit_error", "num_gpus", "resources",
    "_plasma_directory", "_metrics_export_port", "enable_object_reconstruction",
}

_lock = threading.RLock()
_client: Any = None
_cluster: Any = None


def _local_cluster(num_cpus: int | None = None, **kwargs: Any) -> Any:
    """The embedded cluster: a scheduler in this process, one worker process per core.

    Workers are separate ``dask spec`` processes rather than multiprocessing
    children of this one, so a user's script is never re-imported by a worker and
    needs no ``if __name__ == "__main__":`` guard (Ray scripts usually have none).
    GPUs are split across workers, one device list per worker process, so trials
    on different workers never share a device by accident.
    """
    from dask.utils import parse_bytes
    from distributed import Scheduler, SpecCluster
    from distributed.deploy.subprocess import SubprocessWorker

    from dasktune.resources import detect_gpus

    n = int(num_cpus or kwargs.pop("n_workers", None) or os.cpu_count() or 1)
    threads = int(kwargs.pop("threads_per_worker", 1))
    host = kwargs.pop("host", "127.0.0.1")
    dashboard_address = kwargs.pop("dashboard_address", ":8787")
    extra_resources = kwargs.pop("resources", None) or {}
    memory_limit = kwargs.pop("memory_limit", None)
    worker_kwargs = dict(kwargs.pop("worker_kwargs", None) or {})
    if kwargs:
        raise TypeError(f"dasktune.init(): unexpected arguments {sorted(kwargs)}")
    if memory_limit is None:
        import psutil

        memory_limit = int(psutil.virtual_memory().total // n)
    gpus = [g.device_id for g in detect_gpus()]
    workers = {}
    for i in range(n):
        mine = gpus[i::n] if gpus else []
        resources = {"CPU": float(threads), "memory": float(parse_bytes(memory_limit)
                                                          if isinstance(memory_limit, str)
                                                          else memory_limit)}
        env = {}
        if mine:
            resources["GPU"] = float(len(mine))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        resources.update(extra_resources)
        opts = {"host": host, "nthreads": threads, "resources": resources,
                "memory_limit": memory_limit, "silence_logs": logging.ERROR, **worker_kwargs}
        if env:
            opts["env"] = env
        workers[f"worker-{i}"] = {"cls": SubprocessWorker,
                                  "options": {"worker_class": "distributed.Nanny",
                                              "worker_kwargs": opts}}
    scheduler = {"cls": Scheduler, "options": {"host": host,
                                               "dashboard_address": dashboard_address}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                       name="dasktune-local")


def init(address: str | None = None, *, security: Any = None, num_cpus: int | None = None,
         ignore_reinit_error: bool = True, **kwargs: Any) -> Any:
    """Connect to a Dask cluster, or start the embedded one now; returns the ``Client``.

    ``address`` is a scheduler address (``tcp://host:8786``, ``tls://...``), ``"auto"``
    (the ``scheduler-address`` setting) or None (a new local cluster). Other keyword
    arguments go to :class:`distributed.LocalCluster` (``num_cpus`` sets its size);
    Ray-only ones such as ``configure_logging`` are ignored.
    """
    global _client, _cluster
    from distributed import Client

    with _lock:
        if _client is not None:
            same = address is None and not kwargs and num_cpus is None
            if address is not None and _cluster is None:
                same = same or str(address) == str(_client.scheduler.address)
            if same and ignore_reinit_error:
                return _client
            # Ray raises here too: silently keeping the old cluster would run the
            # trials somewhere the caller did not ask for.
            raise RuntimeError(
                f"dasktune.init() was already called (connected to "
                f"{_client.scheduler.address}); call dasktune.shutdown() first")
        for key in list(kwargs):
            if key in _RAY_ONLY:
                kwargs.pop(key)
        if address == "auto":
            address = dask.config.get("scheduler-address", None)
            if address is None:
                raise ValueError("init(address='auto'): no scheduler-address / "
                                 "DASK_SCHEDULER_ADDRESS is set")
        if address is not None:
            if kwargs:
                raise TypeError(f"init(address=...): unexpected arguments {sorted(kwargs)}")
            _client = Client(address, security=security, set_as_default=False)
        else:
            _cluster = _local_cluster(num_cpus, security=security, **kwargs) if security \
                else _local_cluster(num_cpus, **kwargs)
            _client = Client(_cluster, set_as_default=False)
        return _client


def shutdown() -> None:
    """Close what :func:`init` (or an embedded start) opened."""
    global _client, _cluster
    with _lock:
        client, cluster = _client, _cluster
        _client = _cluster = None
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass
    if cluster is not None:
        try:
            cluster.close()
        except Exception:  # noqa: BLE001
            pass


def is_initialized() -> bool:
    return _client is not None


def get_client() -> tuple[Any, Any]:
    """The client trials run on, and the cluster object if dasktune owns it."""
    from distributed import Client
    from distributed.client import _get_global_client

    # An active client (``with Client(addr): tuner.fit()``) is the most local choice.
    active = _get_global_client()
    if active is not None and active.status == "running":
        return active, getattr(active, "cluster", None)
    with _lock:
        if _client is not None:
            return _client, _cluster
    address = dask.config.get("scheduler-address", None)
    with _lock:
        if _client is None:
            if address:
                globals()["_client"] = Client(address, set_as_default=False)
            else:
                init()
        return _client, _cluster


atexit.register(shutdown)
