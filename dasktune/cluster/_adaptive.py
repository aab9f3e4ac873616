"""Adaptive scaling of a local cluster, from inside its detached scheduler process.

Every local cluster with workers (``min_workers <= max_workers``; a pool of fixed size
replaces the workers that die): ``up`` starts ``dask scheduler
--preload dasktune.cluster._adaptive --dasktune-pool POOL.json``; :func:`dask_setup` installs
:class:`LocalWorkerPool`, which owns every worker process of the cluster. It is Dask's
:class:`~distributed.deploy.adaptive_core.AdaptiveCore` (the plan / requested / observed
bookkeeping, ``wait_count`` before a scale-down, the min/max clamp) driven on the
scheduler's loop every ``distributed.adaptive.interval``, with ``dasktune worker``
subprocesses as its workers. A worker is known by its PID (a worker started with a
custom ``worker_command`` has no name we chose; ``WorkerState.pid`` is what it reports).

The target is the scheduler's ``adaptive_target`` handler (Dask's own
:meth:`~distributed.Scheduler.adaptive_target` with dasktune's plugins' additions: walltime
replacements, waiting gangs; :mod:`dasktune.cluster.adaptive_target`), raised to cover
dasktune's trials, which Dask does not see as work: a trial actor occupies its worker
after its creation task finished, and a waiting trial is only a placeholder task
(``dasktune-demand-*``, see :meth:`dasktune.execution.dask_executor.DaskExecutor.demand`) that may
even have run. So the target is at least the workers hosting actors plus the workers
the placeholders' resource requests fill; workers hosting actors are never picked for
retirement (``valid_workers_downscaling``).

The pool records the processes it started in ``<cluster folder>/pool-workers.json``
(it is that file's only writer) so that ``down`` and ``kill-random-worker`` find them,
and publishes ``{"minimum", "maximum"}`` under the scheduler metadata key
:data:`METADATA_KEY` so a driver can tell that the cluster grows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click
import dask
from dask.utils import parse_timedelta
from distributed.deploy.adaptive_core import AdaptiveCore
from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from dasktune.cluster.adaptive_target import adaptive_target
from dasktune.cluster.commands import worker_command

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import WorkerState

__all__ = ["METADATA_KEY", "PLUGIN_NAME", "LocalWorkerPool", "dask_setup", "stop_pool"]

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dasktune-local-pool"
METADATA_KEY = ["dasktune", "adaptive"]
DEMAND_PREFIX = "dasktune-demand-"
_GONE = ("released", "forgotten", "erred")


def write_private_json(path: str, obj: Any) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON, readable only by the user."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


class LocalWorkerPool(AdaptiveCore, SchedulerPlugin):
    """Starts and retires ``dasktune worker`` processes between ``minimum`` and ``maximum``.

    ``spec`` (written by :class:`~dasktune.cluster.local.LocalProvider`): ``minimum``,
    ``maximum``, ``name`` (worker name prefix), ``nthreads``, ``resources`` (besides CPU),
    ``command`` (a custom ``worker_command`` or None), ``tls_args``, ``log_dir`` and
    ``records`` (the file of started processes). Optional ``wait_count`` overrides
    ``distributed.adaptive.wait-count``.
    """

    name = PLUGIN_NAME

    def __init__(self, spec: dict[str, Any]) -> None:
        wait_count = spec.get("wait_count") or dask.config.get("distributed.adaptive.wait-count")
        AdaptiveCore.__init__(self, minimum=int(spec["minimum"]),
                              maximum=int(spec["maximum"]), wait_count=int(wait_count))
        self.spec = spec
        self.interval = parse_timedelta(dask.config.get("distributed.adaptive.interval"))
        self.target_duration = parse_timedelta(
            dask.config.get("distributed.adaptive.target-duration"))
        self.capacity = {"CPU": float(spec["nthreads"]), **spec.get("resources", {})}
        self.scheduler: Scheduler | None = None
        self._procs: dict[int, tuple[subprocess.Popen, dict[str, Any]]] = {}
        self._demands: dict[str, dict[str, float]] = {}  # placeholder key -> its request
        self._periodic: PeriodicCallback | None = None
        self._stopped = False

    # ------------------------------------------------------------ plugin hooks
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        if self.maximum > self.minimum:  # a pool of fixed size only replaces the dead
            scheduler.set_metadata(keys=METADATA_KEY,
                                   value={"minimum": self.minimum, "maximum": self.maximum})
        self._write_records()
        await self._adapt()  # the minimum at once, not one interval later
        self._periodic = PeriodicCallback(self._adapt, self.interval * 1000)
        self._periodic.start()

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        # Placeholders of waiting trials: a key that exists is a trial that still waits,
        # whatever its state (one that ran at once is "memory" until withdrawn).
        if not (isinstance(key, str) and key.startswith(DEMAND_PREFIX)):
            return
        if finish in _GONE:
            self._demands.pop(key, None)
        elif key not in self._demands and self.scheduler is not None:
            ts = self.scheduler.tasks.get(key)
            self._demands[key] = dict(getattr(ts, "resource_restrictions", None) or {})

    def valid_workers_downscaling(self, scheduler: Scheduler,
                                  workers: list[WorkerState]) -> list[WorkerState]:
        # A worker with trial actors is busy though Dask sees no task running there.
        return [ws for ws in workers if not ws.actors]

    async def close(self) -> None:
        """The scheduler is closing: stop adapting and end the workers this pool started."""
        self.stop()
        await asyncio.to_thread(self._terminate, list(self._procs))
        self._reap()

    # ------------------------------------------------------------ AdaptiveCore
    @property
    def plan(self) -> set[int]:
        self._reap()
        return set(self._procs)

    @property
    def requested(self) -> set[int]:
        return self.plan

    @property
    def observed(self) -> set[int]:
        assert self.scheduler is not None
        return {ws.pid for ws in self.scheduler.workers.values()} & self.plan

    async def target(self) -> int:
        assert self.scheduler is not None
        # The handler, not the method: with the plugins' additions (walltime, gangs).
        dask_target = adaptive_target(self.scheduler, self.target_duration)
        busy = sum(1 for ws in self.scheduler.workers.values() if ws.actors)
        return max(dask_target, busy + self._workers_for_waiting())

    async def workers_to_close(self, target: int) -> list[int]:
        assert self.scheduler is not None
        pids = self.scheduler.workers_to_close(target=target, attribute="pid")
        return [p for p in pids if p in self._procs]

    async def scale_up(self, n: int) -> None:  # type: ignore[override]
        for _ in range(min(n, self.maximum) - len(self.plan)):
            self._spawn()
        self._write_records()

    async def scale_down(self, workers: Iterable[int]) -> None:  # type: ignore[override]
        assert self.scheduler is not None
        pids = set(workers)
        addresses = [ws.address for ws in self.scheduler.workers.values() if ws.pid in pids]
        logger.info("dasktune pool: retiring workers %s", addresses)
        if addresses:
            await self.scheduler.retire_workers(workers=addresses, close_workers=True,
                                                remove=True, stimulus_id="dasktune-pool")
        # Retired workers exit by themselves (no nanny); ones that never arrived are ended.
        await asyncio.to_thread(self._terminate, pids)
        self._reap()
        self._write_records()

    # ------------------------------------------------------------ the rest
    def stop(self) -> list[dict[str, Any]]:
        """Stop adapting (``down`` calls this first, so nothing respawns while it kills
        workers); return the records of the live processes."""
        self._stopped = True
        if self._periodic is not None:
            self._periodic.stop()
            self._periodic = None
        self._reap()
        self._write_records()
        return [rec for _, rec in self._procs.values()]

    async def _adapt(self) -> None:
        if self._stopped:
            return
        try:
            await self.adapt()
        except Exception:  # noqa: BLE001 - keep adapting on the next tick, as Adaptive does
            logger.warning("dasktune pool: adapting failed", exc_info=True)

    def _workers_for_waiting(self) -> int:
        """New workers that the waiting trials' requests fill (requests no new worker
        could meet count for nothing)."""
        need: dict[str, float] = {}
        for request in self._demands.values():
            req = request or {"CPU": 1.0}
            if all(self.capacity.get(k, 0.0) >= v for k, v in req.items()):
                for k, v in req.items():
                    need[k] = need.get(k, 0.0) + v
        return max((math.ceil(v / self.capacity[k]) for k, v in need.items()), default=0)

    def _spawn(self) -> None:
        assert self.scheduler is not None
        spec, address = self.spec, self.scheduler.address
        wname = f"{spec['name']}-worker-{os.urandom(3).hex()}"
        argv = (list(spec["command"]) + [address] if spec.get("command") else
                worker_command(address, nthreads=int(spec["nthreads"]), name=wname,
                               resources=spec.get("resources", {})))
        argv += spec.get("tls_args", [])
        log = os.path.join(spec["log_dir"], f"{wname}.log")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            # Own session, as the workers `up` starts: `down` signals each process group.
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        import psutil

        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            created = time.time()
        self._procs[proc.pid] = (proc, {"pid": proc.pid, "create_time": created,
                                        "role": "worker", "log": log, "argv": argv,
                                        "name": wname})
        logger.info("dasktune pool: started worker %s (PID %d)", wname, proc.pid)

    def _reap(self) -> None:
        """Forget (and reap, no zombies) the processes that exited."""
        gone = [pid for pid, (proc, _) in self._procs.items() if proc.poll() is not None]
        for pid in gone:
            del self._procs[pid]
        if gone:
            self._write_records()

    def _terminate(self, pids: Iterable[int], grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace``, the given processes of this pool (on a
        thread: it only waits on them; the loop's :meth:`_reap` forgets them after)."""
        procs = [self._procs[p][0] for p in pids if p in self._procs]
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def _write_records(self) -> None:
        write_private_json(self.spec["records"], [rec for _, rec in self._procs.values()])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def stop_pool(dask_scheduler: Any = None) -> list[dict[str, Any]] | None:
    """On the scheduler (``client.run_on_scheduler``): stop the pool from adapting and
    return its live processes; None where the cluster has no pool."""
    pool = dask_scheduler.plugins.get(PLUGIN_NAME)
    return None if pool is None else pool.stop()


@click.command()
@click.option("--dasktune-pool", "pool_spec", required=True, type=click.Path(exists=True),
              help="The pool's JSON spec, written by `dasktune up`.")
async def dask_setup(scheduler: Scheduler, pool_spec: str) -> None:
    """``dask scheduler --preload dasktune.cluster._adaptive --dasktune-pool SPEC``."""
    with open(pool_spec) as f:
        pool = LocalWorkerPool(json.load(f))
    await pool.start(scheduler)
    scheduler.add_plugin(pool, name=PLUGIN_NAME)
