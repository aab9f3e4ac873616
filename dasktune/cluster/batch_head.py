"""The detached head of a batch cluster: ``python -m dasktune.cluster.batch_head SPEC.json``.

Started by :class:`dasktune.cluster.batch.BatchProvider.up` on the login node. It builds the
dask-jobqueue cluster from the spec (its scheduler runs in this process), writes the
scheduler's address to ``scheduler_file`` and then keeps the worker jobs submitted
(:class:`JobKeeper`): ``min_jobs`` jobs, plus one replacement for each job whose worker
retires within ``dasktune.cluster.walltime.replace-ahead`` (its end time less
``dasktune.cluster.walltime.margin``), up to ``max_jobs``. A job whose workers joined and
then left (retired at their walltime, or cancelled) is dropped, so the cluster asks for a
new one instead of waiting for it. Every job it submits is recorded in ``jobs_file`` (the
provider's ``status`` and ``down`` read it). It installs the walltime plugin
(:class:`~dasktune.cluster.walltime.WalltimePlugin`) itself, so workers leave before their
job's end even when no driver is connected. SIGTERM or SIGINT closes the cluster, which
cancels its jobs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from distributed import Client

from dasktune import _dask_config
from dasktune.cluster.walltime import PLUGIN_NAME as WALLTIME_PLUGIN_NAME
from dasktune.cluster.walltime import WalltimePlugin, job_end_time

logger = logging.getLogger(__name__)

__all__ = ["JobKeeper", "main"]


class JobKeeper:
    """Keeps ``min_jobs`` worker jobs (plus replacements ahead of ends) submitted."""

    def __init__(self, cluster: Any, kind: str, min_jobs: int, max_jobs: int,
                 jobs_file: str) -> None:
        self.cluster, self.kind = cluster, kind
        self.min_jobs, self.max_jobs = min_jobs, max(max_jobs, min_jobs)
        self.jobs_file = jobs_file
        self.lead = (_dask_config.get_seconds("cluster.walltime.margin")
                     + _dask_config.get_seconds("cluster.walltime.replace-ahead"))
        self.poll = _dask_config.get_seconds("cluster.walltime.poll-interval")
        self._joined: set[str] = set()
        self._ends: dict[str, tuple[float, float | None]] = {}  # name -> (asked at, end)
        self._history: dict[str, str | None] = {}  # name -> job id, every job submitted

    def _connected(self) -> set[str]:
        names = set()
        for w in self.cluster.scheduler_info.get("workers", {}).values():
            name = str(w.get("name", ""))
            for job in self.cluster.worker_spec:
                if name == job or name.startswith(f"{job}-"):
                    names.add(job)
        return names

    def _end(self, name: str, job_id: str, now: float) -> float | None:
        asked, end = self._ends.get(name, (-float("inf"), None))
        if now - asked >= self.poll:
            end = job_end_time(self.kind, job_id)
            self._ends[name] = (now, end)
        return end

    def step(self) -> None:
        now = time.time()
        connected = self._connected()
        self._joined |= connected
        for name in [n for n in self.cluster.worker_spec if n in self._joined - connected]:
            logger.info("job %s left: dropping it", name)
            del self.cluster.worker_spec[name]  # its workers left: the job is over
            self._ends.pop(name, None)
        ending = 0
        for name in list(self.cluster.worker_spec):
            job = self.cluster.workers.get(name)
            job_id = getattr(job, "job_id", None)
            if job_id and name in connected:
                end = self._end(name, job_id, now)
                ending += end is not None and end - self.lead <= now
        want = min(self.max_jobs, self.min_jobs + ending)
        more = want - len(self.cluster.worker_spec)
        if more > 0:
            logger.info("%d job(s) end soon: asking for %d job(s) (replacement job(s) ahead: "
                        "%d)", ending, more, min(more, ending))
        self.cluster.scale(jobs=max(want, len(self.cluster.worker_spec)))
        for name, job in self.cluster.workers.items():
            self._history[name] = getattr(job, "job_id", None) or self._history.get(name)
        self._record()

    def _record(self) -> None:
        tmp = f"{self.jobs_file}.tmp"
        with open(tmp, "w") as f:
            json.dump([{"name": n, "job_id": j} for n, j in self._history.items()], f)
        os.replace(tmp, self.jobs_file)


def main(spec_path: str) -> None:
    import dask_jobqueue

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with open(spec_path) as f:
        spec = json.load(f)
    os.makedirs(spec["log_dir"], exist_ok=True)
    cls = getattr(dask_jobqueue, spec["cls"])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = cls(**spec["kwargs"], log_directory=spec["log_dir"],
                  scheduler_options={"dashboard_address": ":0"})
    try:
        # Workers retire before their job's end even while no driver is connected, so
        # the keeper's replacement is not left waiting for a killed job.
        with Client(cluster) as client:
            client.register_plugin(WalltimePlugin(), name=WALLTIME_PLUGIN_NAME)
        keeper = JobKeeper(cluster, spec["kind"], spec["min_jobs"], spec["max_jobs"],
                           spec["jobs_file"])
        keeper.step()
        tmp = spec["scheduler_file"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"address": cluster.scheduler_address,
                       "dashboard_url": cluster.dashboard_link}, f)
        os.replace(tmp, spec["scheduler_file"])
        while not stop.wait(1.0):
            try:
                keeper.step()
            except Exception:  # noqa: BLE001 - a batch tool hiccup: try again next round
                logger.exception("keeping the jobs submitted failed this round")
    finally:
        cluster.close()  # cancels every job of the cluster


if __name__ == "__main__":
    main(sys.argv[1])
