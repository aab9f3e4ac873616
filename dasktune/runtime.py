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
import sys
import threading
import warnings
from numbers import Integral
from typing import Any

import dask.config
from dask import system

from dasktune import _dask_config, orphan_watch
from dasktune.resources import detect_gpus

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


# LocalCluster arguments that configure the scheduler rather than the workers.
_SCHEDULER_ARGS = ("scheduler_port", "protocol", "interface", "blocked_handlers",
                   "scheduler_kwargs", "dashboard_address", "service_kwargs", "services")


class _QuietClose(logging.Filter):
    """Drops distributed's INFO records of streams closed by their other end (with a
    traceback each) once the embedded cluster, whose scheduler lives in this process, is
    being closed: noise at the end of a user's script, where nothing can be done."""

    closing = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.closing and record.levelno < logging.WARNING)


_QUIET_CLOSE = _QuietClose()
logging.getLogger("distributed.batched").addFilter(_QUIET_CLOSE)


def _dashboard_address() -> str:
    """Dask's dashboard port 8787 when it is free, else a free one: a second cluster on
    the machine is common, and distributed's "Port 8787 is already in use" warning says
    nothing the printed link does not."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("", 8787))
        except OSError:
            return ":0"
    return ":8787"


def _worker_cpus(num_cpus: int | None, n_workers: int | None,
                 threads_per_worker: int | None) -> list[int]:
    """The embedded cluster's CPUs, one entry per worker process.

    ``num_cpus`` is Ray's: the logical CPUs of the local node, which trials' ``CPU``
    requests are counted against, whatever the machine has. They are split over
    ``n_workers`` processes (or ``num_cpus / threads_per_worker``), by default one per
    core up to ``num_cpus``: ``init(num_cpus=8)`` on two cores runs eight 1-CPU trials
    at once, as Ray does, in two processes (not eight), and a trial may grow to four
    CPUs on one worker (ResourceChangingScheduler). Without ``num_cpus``: a worker per
    core (or ``n_workers``), each with ``threads_per_worker`` CPUs (1).
    """
    cores = system.CPU_COUNT  # what this process may use (affinity, cgroup quota)
    if num_cpus is None or num_cpus == 0:
        return [int(threads_per_worker or 1)] * int(n_workers or cores)
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, Integral) or num_cpus < 0:
        raise ValueError(f"dasktune.init(): num_cpus must be a whole number >= 0, got "
                         f"{num_cpus!r}")
    num_cpus = int(num_cpus)
    n = int(n_workers or (max(num_cpus // int(threads_per_worker), 1) if threads_per_worker
                          else min(num_cpus, cores)))
    if n > num_cpus:
        raise ValueError(f"dasktune.init(): num_cpus={num_cpus} cannot be split over "
                         f"n_workers={n_workers} (a CPU each at least)")
    share, rest = divmod(num_cpus, n)
    return [share + (i < rest) for i in range(n)]


def _local_cluster(num_cpus: int | None = None, **kwargs: Any) -> Any:
    """The embedded cluster: a scheduler in this process, one worker process per core.

    Takes :class:`distributed.LocalCluster`'s keyword arguments (``n_workers``,
    ``threads_per_worker``, ``processes``, ``host``/``ip``, ``scheduler_port``,
    ``dashboard_address``, ``protocol``, ``interface``, ``silence_logs``,
    ``memory_limit``, ``resources``, ``scheduler_kwargs``, ``worker_kwargs`` and, as
    there, any other ``Worker`` argument).

    Workers are separate ``dask spec`` processes rather than multiprocessing
    children of this one, so a user's script is never re-imported by a worker and
    needs no ``if __name__ == "__main__":`` guard (Ray scripts usually have none).
    GPUs are split across workers, one device list per worker process, so trials
    on different workers never share a device by accident. ``processes=False``
    runs the workers as threads of this process (like LocalCluster).
    """
    import json

    from dask.utils import parse_bytes
    from distributed import Scheduler, SpecCluster, Worker
    from distributed.deploy.subprocess import SubprocessWorker

    if kwargs.pop("asynchronous", False):
        raise TypeError("dasktune.init(): asynchronous=True is not supported (init returns a "
                        "synchronous Client)")
    for unused in ("loop", "start", "worker_class"):
        if kwargs.pop(unused, None) is not None:
            logger.info("dasktune.init(): ignoring %s= (dasktune chooses the worker type)",
                        unused)
    threads_per_worker = kwargs.pop("threads_per_worker", None)
    cpus = _worker_cpus(num_cpus, kwargs.pop("n_workers", None), threads_per_worker)
    n = len(cpus)
    processes = kwargs.pop("processes", None)
    processes = True if processes is None else bool(processes)
    ip = kwargs.pop("ip", None)
    interface = kwargs.get("interface")
    host = kwargs.pop("host", None) or ip or (None if interface else "127.0.0.1")
    silence_logs = kwargs.pop("silence_logs", logging.ERROR)
    extra_resources = kwargs.pop("resources", None) or {}
    memory_limit = kwargs.pop("memory_limit", None)
    name = kwargs.pop("name", None) or "dasktune-local"
    sync_interval = kwargs.pop("scheduler_sync_interval", 1)
    security = kwargs.pop("security", None)
    scheduler_opts: dict[str, Any] = {"host": host, "dashboard_address": _dashboard_address()}
    scheduler_opts.update(kwargs.pop("scheduler_kwargs", None) or {})
    for key in _SCHEDULER_ARGS:
        if key in kwargs and key != "scheduler_kwargs":
            value = kwargs.pop(key)
            scheduler_opts["port" if key == "scheduler_port" else key] = value
    if scheduler_opts.get("dashboard_address", ":8787") is None:
        # LocalCluster's meaning of None: no dashboard. The scheduler still serves its
        # HTTP routes; a random port keeps them off a busy 8787.
        scheduler_opts.update(dashboard=False, dashboard_address=":0")
    if security is not None:
        scheduler_opts["security"] = security
    protocol = scheduler_opts.get("protocol")
    if processes and protocol and str(protocol).rstrip(":/") == "inproc":
        raise ValueError("dasktune.init(protocol='inproc') needs processes=False")
    worker_dashboard = kwargs.pop("worker_dashboard_address", None)
    # As in LocalCluster, the remaining keyword arguments are the workers'.
    worker_kwargs = {**(kwargs.pop("worker_kwargs", None) or {}), **kwargs}
    if security is not None:
        if processes:  # a Security object does not travel in a worker's JSON spec
            raise TypeError("dasktune.init(security=...) without an address needs "
                            "processes=False (or start a secured cluster and pass its address)")
        worker_kwargs["security"] = security
    if memory_limit is None:
        import psutil

        memory_limit = int(psutil.virtual_memory().total // n)
    gpus = [g.device_id for g in detect_gpus()]
    # More CPUs asked for than the machine has (Ray's logical num_cpus): OpenMP threads
    # (XGBoost's nthread, torch) that spin while they wait take the cores from the
    # others; measured here, two XGBoost rounds with nthread=4 among busy cores took 71
    # CPU-seconds spinning and 5.4 passive. The user's own setting wins.
    oversubscribed = {"OMP_WAIT_POLICY": "PASSIVE"} if (
        sum(cpus) > system.CPU_COUNT and "OMP_WAIT_POLICY" not in os.environ) else {}
    workers = {}
    for i in range(n):
        mine = gpus[i::n] if gpus else []
        # Dask threads for the tasks a trial submits: as many as the worker's CPUs.
        threads = int(threads_per_worker or max(cpus[i], 1))
        resources = {"CPU": float(cpus[i]),
                     "memory": float(parse_bytes(memory_limit)
                                                          if isinstance(memory_limit, str)
                                                          else memory_limit)}
        env = dict(oversubscribed)
        if mine:
            resources["GPU"] = float(len(mine))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        resources.update(extra_resources)
        opts: dict[str, Any] = {"host": host, "nthreads": threads, "resources": resources,
                                "memory_limit": memory_limit}
        for key in ("protocol", "interface"):
            if scheduler_opts.get(key):
                opts[key] = scheduler_opts[key]
        if worker_dashboard is not None:
            opts["dashboard_address"] = worker_dashboard
        if not processes:
            workers[f"worker-{i}"] = {"cls": Worker, "options": {**opts, **worker_kwargs}}
            continue
        opts.update({"silence_logs": silence_logs, **worker_kwargs})
        # Import the trial actor's module while the worker starts (init waits for the
        # workers), not inside the first trial's start-up; the worker and its nanny leave
        # at once, silently, when this process dies (dasktune.orphan_watch).
        preload = opts.get("preload") or []
        opts["preload"] = [*([preload] if isinstance(preload, str) else preload),
                           *([] if "dasktune.actor" in preload else ["dasktune.actor"]),
                           "dasktune.orphan_watch"]
        # The driver's PID, for the orphan watch: read from the nanny's parent instead,
        # a driver killed while the worker starts would already be PID 1 there.
        opts["env"] = {**(env or {}), orphan_watch.DRIVER_PID_ENV: str(os.getpid())}
        try:
            json.dumps(opts)
        except TypeError as exc:  # worker processes get their options as JSON
            raise TypeError(f"dasktune.init(): worker options must be plain values with "
                            f"processes=True: {exc}") from None
        workers[f"worker-{i}"] = {"cls": SubprocessWorker,
                                  "options": {"worker_class": "distributed.Nanny",
                                              "worker_kwargs": opts}}
    scheduler = {"cls": Scheduler, "options": scheduler_opts}
    with warnings.catch_warnings():
        # 8787 taken between the probe and the bind: the link printed says where it is.
        warnings.filterwarnings("ignore", message="Port 8787 is already in use")
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=silence_logs,
                           name=name, scheduler_sync_interval=sync_interval,
                           security=security)


def init(address: str | None = None, *, security: Any = None, num_cpus: int | None = None,
         ignore_reinit_error: bool = True, **kwargs: Any) -> Any:
    """Connect to a Dask cluster, or start the embedded one now; returns the ``Client``.

    ``address`` is a scheduler address (``tcp://host:8786``, ``tls://...``), ``"auto"``
    (the ``scheduler-address`` setting) or None. With None, as ``ray.init()`` honours
    ``RAY_ADDRESS``, a configured ``scheduler-address`` (``DASK_SCHEDULER_ADDRESS``)
    is connected to; otherwise a new local cluster starts. Other keyword arguments go
    to :class:`distributed.LocalCluster`; ``num_cpus`` is Ray's, the CPUs trials are
    counted against, split over a worker process per core (at most ``num_cpus``
    processes). Ray-only arguments such as ``configure_logging`` are ignored.
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
        configured = dask.config.get("scheduler-address", None)
        if address == "auto":
            address = configured
            if address is None:
                raise ValueError("init(address='auto'): no scheduler-address / "
                                 "DASK_SCHEDULER_ADDRESS is set")
        elif address is None and configured:
            address = configured
            if kwargs or num_cpus is not None:
                # Ray too refuses cluster-shaping arguments when RAY_ADDRESS is set.
                raise TypeError(
                    f"dasktune.init(): scheduler-address / DASK_SCHEDULER_ADDRESS is set "
                    f"({configured}), so the local-cluster arguments "
                    f"{sorted([*kwargs, *(['num_cpus'] if num_cpus is not None else [])])} "
                    "cannot apply; unset it to start a local cluster")
        if address is not None:
            if kwargs:
                raise TypeError(f"init(address=...): unexpected arguments {sorted(kwargs)}")
            _client = Client(address, security=security, set_as_default=False)
        else:
            _QUIET_CLOSE.closing = False
            _cluster = _local_cluster(num_cpus, security=security, **kwargs)
            # At exit, close it here first (handlers run last-registered first), not in
            # distributed's own handler, registered when distributed was imported.
            atexit.unregister(shutdown)
            atexit.register(shutdown)
            _client = Client(_cluster, set_as_default=False,
                             **({"security": security} if security is not None else {}))
            _wait_for_local_workers(_client, len(_cluster.worker_spec))
            if _client.dashboard_link and _cluster.scheduler_spec["options"].get("dashboard",
                                                                                True):
                # Ray prints its dashboard's address at init; the port may not be 8787.
                print(f"Dask dashboard: {_client.dashboard_link} (trials: /dasktune)",
                      file=sys.stderr)
        return _client


def _wait_for_local_workers(client: Any, n: int) -> None:
    """Return once the embedded cluster's workers have joined, so that their start-up
    (seconds: a process each, imports) is paid here and not by the first trials."""
    timeout = _dask_config.get_seconds("local-cluster.start-timeout")
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        # Not fatal: fit() places trials on whichever workers have joined by then.
        logger.warning("dasktune.init(): %d of %d local workers joined within %.0fs",
                       len(client.scheduler_info(n_workers=-1).get("workers", {})), n,
                       timeout)


def shutdown() -> None:
    """Close what :func:`init` (or an embedded start) opened."""
    global _client, _cluster
    with _lock:
        client, cluster = _client, _cluster
        _client = _cluster = None
    if cluster is not None:
        _QUIET_CLOSE.closing = True
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
    """Whether ``dasktune.init`` has connected a client that is still open."""
    return _client is not None


def get_client() -> tuple[Any, Any]:
    """The client trials run on, and the cluster object if dasktune owns it."""
    from distributed import Client

    # An active client (``with Client(addr): tuner.fit()``) is the most local choice.
    try:
        active = Client.current()
    except ValueError:  # no client: dasktune's own, or a new one
        active = None
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
