"""Moving a worker's trials before its batch job's time limit or its ``--lifetime`` ends it.

On an HPC batch system (Slurm, PBS, SGE, LSF) every worker lives inside a job with a time
limit, and at the limit the batch system signals every process of the job at once: a
worker's child dies with its nanny and its trials come back as lost. Each worker that runs
inside a job (``SLURM_JOB_ID``, ``PBS_JOBID``, ``JOB_ID`` with ``SGE_ROOT``, ``LSB_JOBID``)
learns the job's end time from the batch system's own tool (``squeue``, ``qstat``,
``bjobs``; asked again every ``dasktune.cluster.walltime.poll-interval``, since a limit can
be changed) and, ``dasktune.cluster.walltime.margin`` before it, retires itself through the
scheduler: the same graceful path as a spot notice, so class Trainables checkpoint on
demand and function trainables move at their next reported checkpoint, and the move is no
failure.

A worker's own ``--lifetime`` (``distributed.worker.lifetime.duration``, batch job or not)
is an end too: Dask closes the worker then and a function trainable gets only
``dasktune.executor.evacuate-timeout`` to reach a checkpoint, so the worker retires the
same way before it. The lifetime runs from the Worker's construction (where distributed
starts its timer, the ``stagger`` drawn into ``Worker.lifetime``); the plugin counts it from
the worker process's start, a moment earlier, so it is never late. The lead before a
lifetime's end is the margin capped at a quarter of the lifetime (:func:`retire_time`): a
worker always serves three quarters of its lifetime, however short, and says so once (a
warning naming both) where the cap shortens the margin. Dask refuses a retirement while a
trial's actor is there and the worker runs on until the trial moved, so a trial still there
at the lifetime meets Dask's own close, which gives it ``dasktune.executor.evacuate-timeout``
more: a function trainable loses nothing when it reports a checkpoint within the lead plus
that timeout. Left to Dask: a ``--lifetime-restart`` worker (the nanny restarts it in
place, which a retirement would not), and a Worker built in a process older than its
lifetime (an in-process cluster: its start cannot be told).

:func:`dasktune.execution.recovery.register` installs :class:`WalltimePlugin` on every cluster a
driver uses (a worker with neither a batch job nor a lifetime has nothing to watch), and
:class:`WalltimeTargetPlugin` on its scheduler: ``replace-ahead`` before retiring, a worker
announces it, and Dask's ``Adaptive`` (``cluster.adapt()``) then asks for its replacement
while the job still runs.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import os
import re
import shutil
import subprocess
import time
from typing import Any

import psutil
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from dasktune import _dask_config
from dasktune.cluster.adaptive_target import add_to_adaptive_target
from dasktune.cluster.retire import retire_gracefully

logger = logging.getLogger(__name__)

__all__ = ["LIFETIME_SERVED", "PLUGIN_NAME", "TARGET_PLUGIN_NAME", "WalltimePlugin",
           "WalltimeTargetPlugin", "batch_job", "job_end_time", "parse_duration",
           "lifetime_lead", "retire_time", "worker_lifetime"]

PLUGIN_NAME = "dasktune-walltime"
TARGET_PLUGIN_NAME = "dasktune-walltime-target"
ENDING_TOPIC = "dasktune-walltime-ending"
#: A worker retires no earlier than this share of its ``--lifetime`` after it started.
LIFETIME_SERVED = 0.75


def batch_job(env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(batch system, job id) of the job this process runs in, or None outside one."""
    env = dict(os.environ if env is None else env)
    if env.get("SLURM_JOB_ID"):
        return "slurm", env["SLURM_JOB_ID"]
    if env.get("PBS_JOBID"):
        return "pbs", env["PBS_JOBID"]
    if env.get("LSB_JOBID"):
        return "lsf", env["LSB_JOBID"]
    if env.get("JOB_ID") and env.get("SGE_ROOT"):  # JOB_ID alone is too common a name
        return "sge", env["JOB_ID"]
    return None


def parse_duration(text: str) -> float | None:
    """``[[D-]HH:]MM:SS``, ``HH:MM`` (LSF's time left) or plain seconds -> seconds."""
    text = text.strip().split()[0] if text.strip() else ""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        return None
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if b is None:
        return float(a) if days is None else float(days * 86400 + a * 3600)
    hms = (a, b, c) if c is not None else ((a, b, 0) if days is not None else (0, a, b))
    return float((days or 0) * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2])


def _local_time(text: str, formats: tuple[str, ...]) -> float | None:
    for fmt in formats:
        try:
            return _dt.datetime.strptime(text.strip(), fmt).timestamp()  # local time
        except ValueError:
            continue
    return None


def parse_slurm_end(text: str) -> float | None:
    """``squeue -o %e`` (``2026-12-06T10:18:34``, local time) -> epoch seconds."""
    return _local_time(text, ("%Y-%m-%dT%H:%M:%S",))


def parse_pbs(text: str, now: float) -> float | None:
    """``qstat -f JOB`` -> end time: the walltime limit less the walltime used so far."""
    fields = dict(re.findall(r"^\s*([\w.]+)\s*=\s*(.*?)\s*$", text, re.M))
    limit = parse_duration(fields.get("Resource_List.walltime", ""))
    if limit is None:
        return None
    used = parse_duration(fields.get("resources_used.walltime", "")) or 0.0
    return now + limit - used


def parse_sge(text: str) -> float | None:
    """``qstat -j JOB -xml`` (or the plain ``qstat -j JOB`` of Grid Engines that print a
    ``start_time`` line) -> end time: its start time plus its ``h_rt`` limit.

    Son of Grid Engine (Debian's ``gridengine``) prints no start time in plain
    ``qstat -j``; its XML has ``JAT_start_time`` (epoch seconds; milliseconds in some
    later Grid Engines) and the ``h_rt`` request as ``CE_name``/``CE_stringval``.
    """
    if text.lstrip().startswith("<"):
        limit = re.search(r"<CE_name>h_rt</CE_name>.*?<CE_stringval>([^<]+)</CE_stringval>",
                          text, re.S)
        start = re.search(r"<JAT_start_time>(\d+)</JAT_start_time>", text)
        if not (limit and start):
            return None
        began = float(start.group(1))
        began = began / 1000.0 if began > 1e11 else began
    else:
        limit = re.search(r"h_rt=([\d:]+)", text)
        start_line = re.search(r"^start_time\s+(?:\d+:\s*)?(.+?)(?:\.\d+)?\s*$", text, re.M)
        if not (limit and start_line):
            return None
        began = _local_time(start_line.group(1),
                            ("%m/%d/%Y %H:%M:%S", "%a %b %d %H:%M:%S %Y"))
    seconds = parse_duration(limit.group(1))
    return None if began is None or seconds is None else began + seconds


def parse_lsf(text: str, now: float) -> float | None:
    """``bjobs -noheader -o time_left JOB`` (``H:MM L``; ``-`` without a limit) -> end time."""
    m = re.match(r"\s*(\d+):(\d+)", text)
    return now + int(m.group(1)) * 3600 + int(m.group(2)) * 60 if m else None


_QUERIES = {
    "slurm": lambda job: ["squeue", "-h", "-j", job, "-o", "%e"],
    "pbs": lambda job: ["qstat", "-f", job],
    "sge": lambda job: ["qstat", "-j", job, "-xml"],
    "lsf": lambda job: ["bjobs", "-noheader", "-o", "time_left", job],
}


def job_end_time(system: str, job_id: str, timeout: float = 10.0) -> float | None:
    """When the batch job ``job_id`` reaches its time limit (epoch seconds); None when it
    has none or the batch system's tool cannot tell (blocking: run it off the loop)."""
    argv = _QUERIES[system](job_id)
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    now = time.time()
    if system == "slurm":
        return parse_slurm_end(out)
    if system == "pbs":
        return parse_pbs(out, now)
    if system == "sge":
        return parse_sge(out)
    return parse_lsf(out, now)


def retire_time(margin: float, job_end: float | None = None,
                lifetime: tuple[float, float] | None = None) -> float | None:
    """When a worker retires (epoch seconds; None: no end known): ``margin`` before its
    job's end, and before its lifetime's end (``lifetime`` = (start, seconds)) by the
    margin capped at a quarter of the lifetime, whichever comes first."""
    times = [] if job_end is None else [job_end - margin]
    if lifetime is not None:
        start, seconds = lifetime
        times.append(start + seconds - lifetime_lead(margin, seconds))
    return min(times, default=None)


def lifetime_lead(margin: float, seconds: float) -> float:
    """How long before the end of a ``seconds`` lifetime its worker retires: ``margin``,
    at most the share of the lifetime beyond :data:`LIFETIME_SERVED`."""
    return min(margin, (1.0 - LIFETIME_SERVED) * seconds)


def worker_lifetime(worker: Any, now: float | None = None) -> tuple[float, float] | None:
    """(start, seconds) of ``worker``'s ``--lifetime``, counted from its process's start;
    None without one, with ``--lifetime-restart``, or when the process is older than the
    lifetime (a Worker built later inside a longer-lived process: its start is unknown)."""
    seconds = getattr(worker, "lifetime", None)
    if not seconds or getattr(worker, "lifetime_restart", False):
        return None
    start = psutil.Process().create_time()
    if start + seconds <= (time.time() if now is None else now):
        logger.info("%s: this process is older than the worker's lifetime (%.0fs): leaving "
                    "the lifetime to Dask", getattr(worker, "address", "worker"), seconds)
        return None
    return start, float(seconds)


class WalltimePlugin(WorkerPlugin):
    """Retire a worker before its batch job's time limit or its ``--lifetime`` ends it
    (:func:`retire_time`).

    ``margin`` and ``poll_interval`` are read from ``dasktune.cluster.walltime`` where the
    plugin is made (the driver) when not given.
    """

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self, margin: float | None = None, poll_interval: float | None = None,
                 ) -> None:
        self.margin = (_dask_config.get_seconds("cluster.walltime.margin")
                       if margin is None else float(margin))
        self.poll_interval = (_dask_config.get_seconds("cluster.walltime.poll-interval")
                              if poll_interval is None else float(poll_interval))
        self.replace_ahead = _dask_config.get_seconds("cluster.walltime.replace-ahead")
        if self.margin < 0 or self.poll_interval <= 0:
            raise ValueError(f"walltime margin must be >= 0 and poll interval > 0, got "
                             f"{self.margin!r} and {self.poll_interval!r}")
        self._task: asyncio.Task[None] | None = None

    def setup(self, worker: Any = None, **kwargs: Any) -> None:
        job, lifetime = batch_job(), worker_lifetime(worker)
        lead = None if lifetime is None else lifetime_lead(self.margin, lifetime[1])
        if lifetime is not None and lead is not None and lead < self.margin:
            logger.warning(
                "%s: its lifetime (%.0fs) is short for dasktune.cluster.walltime.margin "
                "(%.0fs): it retires %.0fs before the lifetime's end (it serves %.0f%% of "
                "it), not the margin; a function trainable there moves without loss if it "
                "checkpoints within that plus dasktune.executor.evacuate-timeout",
                getattr(worker, "address", "worker"), lifetime[1], self.margin, lead,
                100 * LIFETIME_SERVED)
        if job is not None or lifetime is not None:
            self._task = asyncio.ensure_future(self._watch(worker, job, lifetime))

    def teardown(self, worker: Any = None, **kwargs: Any) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, worker: Any, job: tuple[str, str] | None,
                     lifetime: tuple[float, float] | None) -> None:
        loop = asyncio.get_running_loop()
        announced = False
        while True:
            end = None if job is None else await loop.run_in_executor(None, job_end_time, *job)
            at = retire_time(self.margin, end, lifetime)
            if at is None:  # a job whose end its batch system cannot tell (yet)
                await asyncio.sleep(self.poll_interval)
                continue
            left = at - time.time()
            if left <= self.replace_ahead and not announced:
                # An adaptive cluster asks for this worker's replacement from now on.
                worker.log_event(ENDING_TOPIC, {"worker": worker.address})
                announced = True
            if left <= 0:
                break
            ahead = left - self.replace_ahead
            await asyncio.sleep(min(left if ahead <= 0 else ahead, self.poll_interval))
        now = time.time()
        if job is not None and end is not None and end - self.margin <= at:
            reason = f"{job[0]} job {job[1]} reaches its time limit in {max(0.0, end - now):.0f}s"
        else:  # the lifetime's end came first
            start, seconds = lifetime or (now, 0.0)
            reason = f"its lifetime ({seconds:.0f}s) ends in {max(0.0, start + seconds - now):.0f}s"
        await retire_gracefully(worker, reason)


class WalltimeTargetPlugin(SchedulerPlugin):
    """Asks Dask's ``Adaptive`` (``cluster.adapt()``) for a replacement ahead of each end.

    Each worker that announced its retirement within ``replace-ahead`` (on
    :data:`ENDING_TOPIC`) adds one worker to the scheduler's ``adaptive_target`` until it
    leaves (with the other plugins' additions: :mod:`dasktune.cluster.adaptive_target`),
    so an adaptive cluster below its maximum submits the replacement job while the old
    one still runs. Workers hosting trial actors are never picked for downscaling (Dask
    sees no task running there).
    """

    idempotent = True
    name = TARGET_PLUGIN_NAME

    def __init__(self) -> None:
        self._ending: set[str] = set()
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        add_to_adaptive_target(scheduler, self.ending_workers)

    def ending_workers(self) -> int:
        """The workers still here that announced their end: each wants a replacement."""
        return len(self._ending & set(self.scheduler.workers)) if self.scheduler else 0

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        if topic == ENDING_TOPIC and isinstance(msg, dict) and msg.get("worker"):
            self._ending.add(msg["worker"])

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self._ending.discard(worker)

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        return [ws for ws in workers if not ws.actors]
