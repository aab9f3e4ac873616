"""``provider: {type: slurm | pbs | sge | lsf}``: worker jobs on an HPC batch system.

Built on dask-jobqueue's own cluster classes (``SLURMCluster``, ``PBSCluster``,
``SGECluster``, ``LSFCluster``): the worker node type's ``node_config`` is one job's shape
(:class:`~dasktune.cluster.config.BatchNodeConfig`), turned into that class's keywords by
:func:`jobqueue_kwargs`. ``up`` starts :mod:`dasktune.cluster.batch_head` on this machine
(the login node) as a detached process, as the local provider starts its scheduler: it
owns the dask-jobqueue cluster (the scheduler runs in it) and keeps the worker jobs
submitted, asking for a replacement ahead of each job's end where ``max_workers`` leaves
room. ``submit``, ``exec`` and ``logs`` run here, as for a local cluster; ``status`` lists
the jobs (state, time left); ``down`` stops the head, which cancels its jobs, and cancels
any job it recorded that is still queued.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from typing import Any

from dask.utils import parse_bytes

from dasktune.cluster._base import Progress, quiet
from dasktune.cluster.config import BatchNodeConfig, ClusterConfig
from dasktune.cluster.local import LocalProvider, process_alive, stop_processes
from dasktune.cluster.walltime import job_end_time

__all__ = ["BatchProvider", "JOBQUEUE_CLASSES", "jobqueue_kwargs"]

JOBQUEUE_CLASSES = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster",
                    "lsf": "LSFCluster"}
_CANCEL = {"slurm": ["scancel"], "pbs": ["qdel"], "sge": ["qdel"], "lsf": ["bkill"]}
_ACCOUNT_KEY = {"slurm": "account", "pbs": "account", "sge": "project", "lsf": "project"}


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def jobqueue_kwargs(config: ClusterConfig, name: str) -> dict[str, Any]:
    """The dask-jobqueue cluster keywords for ``config``'s worker jobs.

    Each of a job's ``processes`` workers advertises its share of the job's cores, GPUs
    and memory as the ``CPU``, ``GPU`` and ``memory`` resources trials ask for.
    """
    kind = config.provider.type
    node: BatchNodeConfig = config.node_config(config.worker_type_name)
    share = {"CPU": node.cores / node.processes, "GPU": node.gpus / node.processes,
             "memory": math.floor(parse_bytes(node.memory) / node.processes)}
    share.update(config.worker.resources)
    directives = list(node.job_extra_directives)
    if node.gpus and kind == "slurm":
        directives.append(f"--gres=gpu:{node.gpus}")
    elif node.gpus and kind == "lsf":
        directives.append(f'-gpu "num={node.gpus}"')
    resources = ",".join(f"{k}={_number(v)}" for k, v in share.items())
    kwargs: dict[str, Any] = {
        "cores": node.cores, "memory": node.memory, "processes": node.processes,
        "job_name": name, "job_extra_directives": directives,
        "job_script_prologue": list(node.job_script_prologue),
        "worker_extra_args": ["--resources", resources, *node.worker_extra_args],
    }
    for key in ("walltime", "interface", "local_directory", "python"):
        if getattr(node, key) is not None:
            kwargs[key] = getattr(node, key)
    if config.provider.partition:
        kwargs["queue"] = config.provider.partition
    if config.provider.account:
        kwargs[_ACCOUNT_KEY[kind]] = config.provider.account
    return kwargs


def job_script(config: ClusterConfig, name: str | None = None) -> str:
    """The job script dask-jobqueue would submit for one worker job of ``config``."""
    import dask_jobqueue

    cls = getattr(dask_jobqueue, JOBQUEUE_CLASSES[config.provider.type])
    kwargs = jobqueue_kwargs(config, name or config.cluster_name)
    job = cls.job_cls("tcp://<scheduler>:8786", name="worker", **kwargs)
    return job.job_script()


class BatchProvider(LocalProvider):
    """Scheduler on the login node (a detached head process), workers as batch jobs."""

    kind = "slurm"

    def __init__(self, config: ClusterConfig, name: str | None = None) -> None:
        super().__init__(config, name)
        self.kind = config.provider.type
        try:
            import dask_jobqueue  # noqa: F401
        except ImportError:
            raise ImportError(f'provider {self.kind!r} needs dask-jobqueue: '
                              'pip install "dasktune[hpc]"') from None

    @property
    def _jobs_file(self) -> Any:
        return self.state.dir / "batch-jobs.json"

    @property
    def _per_job(self) -> int:
        return self.config.node_config(self.config.worker_type_name).processes

    def up(self, *, restart_only: bool = False, timeout: float = 300.0,
           progress: Progress = quiet) -> dict[str, Any]:
        if self.state.exists():
            old = self.state.read()
            head = [r for r in old.get("processes", []) if r["role"] == "scheduler"]
            if not restart_only and head and all(process_alive(r) for r in head):
                progress(f"cluster {self.name!r} is already up at {old['scheduler_address']}")
                return old
            progress("restarting the head process")
            self.down()
        elif restart_only:
            raise ValueError(f"--restart-only: cluster {self.name!r} is not up")
        if not restart_only:
            self.run_setup_commands(progress)
        self.state.ensure_dir()
        sched_file = self.state.dir / "scheduler.json"
        sched_file.unlink(missing_ok=True)
        spec = {"cls": JOBQUEUE_CLASSES[self.kind], "kind": self.kind,
                "kwargs": jobqueue_kwargs(self.config, self.name),
                "min_jobs": math.ceil(self.config.min_workers / self._per_job),
                "max_jobs": math.ceil(self.config.max_workers / self._per_job),
                "scheduler_file": str(sched_file), "jobs_file": str(self._jobs_file),
                "log_dir": str(self.state.dir / "jobs")}
        spec_path = self.state.private_file("batch.json")
        spec_path.write_text(json.dumps(spec))
        state: dict[str, Any] = {"name": self.name, "provider": self.kind, "processes": [],
                                 "jobs": [], "tls": None}
        self.state.write(state)
        try:
            head = self._spawn([sys.executable, "-m", "dasktune.cluster.batch_head",
                                str(spec_path)], "scheduler", "head.log")
            state["processes"].append(head)
            self.state.write(state)
            progress(f"starting the scheduler and {spec['min_jobs']} {self.kind} job(s)")
            info = self._wait_scheduler_file(sched_file, head, timeout)
            state.update(scheduler_address=info["address"],
                         dashboard_url=info.get("dashboard_url"))
            self.state.write(state)
            self.wait_for_workers(self.config.min_workers, timeout, progress)
        except BaseException:
            self.down()
            raise
        return state

    def batch_jobs(self) -> list[dict[str, Any]]:
        """The jobs the head submitted: ``job_id``, ``name``, ``state``, ``time_left`` (s)."""
        try:
            jobs = json.loads(self._jobs_file.read_text())
        except (FileNotFoundError, ValueError):
            return []
        states = self._queue_states([j["job_id"] for j in jobs if j.get("job_id")])
        now = time.time()
        out = []
        for j in jobs:
            jid = j.get("job_id")
            if not jid or jid not in states:
                continue  # finished and gone from the queue
            end = job_end_time(self.kind, jid)
            out.append({"job_id": jid, "name": j["name"], "state": states[jid],
                        "time_left": None if end is None else max(0.0, end - now)})
        return out

    def _queue_states(self, ids: list[str]) -> dict[str, str]:
        """Job id -> state, for the ids still known to the batch system."""
        if not ids:
            return {}
        if self.kind == "slurm":
            res = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"],
                                 capture_output=True, text=True)
            return dict(line.split(None, 1) for line in res.stdout.splitlines() if line.strip())
        out = {}
        for jid in ids:  # other systems: known (queued or running) while it has an end
            if job_end_time(self.kind, jid) is not None:
                out[jid] = "queued-or-running"
        return out

    def down(self, *, progress: Progress = quiet) -> None:
        if not self.state.exists():
            progress(f"cluster {self.name!r} is not up; nothing to do")
            return
        state = self.state.read()
        stop_processes(state.get("jobs", []))  # detached drivers first
        head = state.get("processes", [])
        progress(f"stopping the head process and cancelling its {self.kind} jobs")
        stop_processes(head, grace=30.0)  # the head cancels its jobs as it closes
        try:
            recorded = [j["job_id"] for j in json.loads(self._jobs_file.read_text())
                        if j.get("job_id")]
        except (FileNotFoundError, ValueError):
            recorded = []
        left = list(self._queue_states(recorded))
        if left:
            subprocess.run(_CANCEL[self.kind] + left, capture_output=True)
        self.state.remove()

    def kill_worker_hard(self, *, rng: random.Random | None = None) -> str:
        running = [j for j in self.batch_jobs() if j["state"].upper() == "RUNNING"]
        if not running:
            raise ValueError(f"cluster {self.name!r} has no running job")
        victim = (rng or random).choice(running)
        # Slurm: SIGKILL to the job's processes, no grace; elsewhere the cancel command.
        kill = ["scancel", "--signal=KILL"] if self.kind == "slurm" else _CANCEL[self.kind]
        subprocess.run(kill + [victim["job_id"]], check=True, capture_output=True)
        return f"job {victim['job_id']} ({victim['name']})"
