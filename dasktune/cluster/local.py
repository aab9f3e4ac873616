"""``provider: {type: local}``: a real scheduler and workers as detached processes here.

Each process gets its own session (so a closing terminal does not take it along) and is
recorded with its start time, so ``down`` kills exactly the processes it started even if a
PID was reused meanwhile.

The workers belong to a pool inside the scheduler process (:mod:`dasktune.cluster._adaptive`),
which keeps ``min_workers`` running (a worker that dies is replaced) and, with
``min_workers < max_workers``, adapts between the two; it records them in its own file;
``down`` stops the pool from adapting before it stops the processes.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dasktune.cluster._adaptive import stop_pool
from dasktune.cluster._base import ClusterProvider, Progress, quiet
from dasktune.cluster.commands import dasktune_command, worker_command

__all__ = ["LocalProvider", "process_alive", "stop_processes", "worker_command"]


def _adapt_interval() -> float:
    """``distributed.adaptive.interval`` in seconds: how often the pool adapts."""
    import dask
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("distributed.adaptive.interval")))


def process_alive(rec: dict[str, Any]) -> bool:
    import psutil

    try:
        p = psutil.Process(rec["pid"])
        # A different start time means the PID now belongs to someone else.
        return (abs(p.create_time() - rec["create_time"]) < 1.0
                and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def stop_processes(recs: Sequence[dict[str, Any]], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Signal the recorded processes (their own process groups), SIGKILL stragglers, verify."""
    # A detached `submit --stop` runs `down` inside the job's own process group: spare it.
    live = [r for r in recs if process_alive(r) and r["pid"] != os.getpgrp()]
    for r in live:
        _signal(r["pid"], sig)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if process_alive(r)]
    for r in live:
        _signal(r["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [r for r in live if process_alive(r)]
    if live:
        raise RuntimeError(f"processes still running after SIGKILL: {[r['pid'] for r in live]}")


def _tls_args(tls: dict[str, str] | None) -> list[str]:
    if not tls:
        return []
    return ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]


def _stop_all(recs: Sequence[dict[str, Any]]) -> None:
    """Drivers, then workers, then the scheduler: a worker whose scheduler is gone would
    spend its whole close timeout trying to say goodbye."""
    for role in ("job", "worker", "scheduler"):
        stop_processes([r for r in recs if r["role"] == role])


def _signal(pid: int, sig: int) -> None:
    try:
        # start_new_session made each process the leader of its own group.
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


class LocalProvider(ClusterProvider):
    """Scheduler and ``min_workers`` workers on 127.0.0.1, outliving the command."""

    kind = "local"
    head_is_here = True  # `exec` runs on this machine

    def _spawn(self, argv: list[str], role: str, log_name: str,
               env: dict[str, str] | None = None) -> dict[str, Any]:
        import psutil

        log = self.state.private_file(log_name)
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **(env or {})})
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            created = time.time()
        return {"pid": proc.pid, "create_time": created, "role": role, "log": str(log),
                "argv": argv}

    def _tls_files(self) -> dict[str, str]:
        from distributed.security import Security

        sec = Security.temporary()
        return self.state.write_tls(sec.tls_ca_file, sec.tls_scheduler_cert,
                                    sec.tls_scheduler_key)

    def up(self, *, restart_only: bool = False, timeout: float = 120.0,
           progress: Progress = quiet) -> dict[str, Any]:
        old: dict[str, Any] = {}
        if self.state.exists():
            old = self.state.read()
            sched = [r for r in old.get("processes", []) if r["role"] == "scheduler"]
            if not restart_only and sched and all(process_alive(r) for r in sched):
                return self._top_up(old, timeout, progress)
            progress("restarting the Dask processes")
            _stop_all(self._stop_pool(old))
        elif restart_only:
            raise ValueError(f"--restart-only: cluster {self.name!r} is not up")
        if not restart_only:
            self.run_setup_commands(progress)
        self.state.ensure_dir()
        tls = self._tls_files() if self.config.provider.tls else None
        tls_args = _tls_args(tls)
        sched_file = self.state.dir / "scheduler.json"
        sched_file.unlink(missing_ok=True)
        preload = self._pool_args(tls_args) if self._pooled else []
        # Detached jobs outlive a restart of the Dask processes: keep their records (and
        # the cluster file's path) so `logs` reads them and `down` still stops them.
        state: dict[str, Any] = {"name": self.name, "provider": "local", "processes": [],
                                 "jobs": old.get("jobs", []), "tls": tls}
        if old.get("config_path"):
            state["config_path"] = old["config_path"]
        self.state.write(state)
        try:
            sched = self._spawn(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                 "--port", "0", "--dashboard-address", "127.0.0.1:0",
                 "--protocol", "tls" if tls else "tcp",
                 "--scheduler-file", str(sched_file), *tls_args, *preload],
                "scheduler", "scheduler.log")
            state["processes"].append(sched)
            self.state.write(state)
            progress("starting the scheduler")
            info = self._wait_scheduler_file(sched_file, sched, timeout)
            address = info["address"]
            dash = info.get("services", {}).get("dashboard")
            state.update(scheduler_address=address,
                         dashboard_url=f"http://127.0.0.1:{dash}/status" if dash else None)
            self.state.write(state)
            if not self._pooled:  # else the pool starts min_workers itself
                self._start_workers(state, self._n_workers)
            self.wait_for_workers(self._n_workers, timeout, progress)
        except BaseException:
            # Leave nothing behind: a failed up is as clean as a down, except for the
            # logs the error points to.
            _stop_all(self._stop_pool(state) + state["jobs"])
            self.state.remove(keep_logs=True)
            raise
        return state

    @property
    def _pooled(self) -> bool:
        """Whether a pool owns the workers: always, but for a cluster of no workers."""
        return self.config.max_workers > 0

    @property
    def _n_workers(self) -> int:
        if self.config.adaptive:
            return self.config.min_workers
        return max(self.config.min_workers, 1 if self.config.max_workers else 0)

    @property
    def _pool_records(self) -> Path:
        return self.state.dir / "pool-workers.json"

    def _pool_args(self, tls_args: list[str]) -> list[str]:
        """Write the adaptive pool's spec; the scheduler's ``--preload`` arguments."""
        node = self.config.worker
        spec = {"minimum": self.config.min_workers, "maximum": self.config.max_workers,
                "name": self.name, "nthreads": int(node.resources.get("CPU", 1)),
                "resources": {k: v for k, v in node.resources.items() if k != "CPU"},
                "command": self.config.worker_command, "tls_args": tls_args,
                "log_dir": str(self.state.dir), "records": str(self._pool_records)}
        if self.config.idle_timeout_minutes:
            # Dask retires an idle worker after wait_count intervals of wanting to.
            interval = _adapt_interval()
            spec["wait_count"] = max(1, round(self.config.idle_timeout_minutes * 60 / interval))
        path = self.state.private_file("pool.json")
        path.write_text(json.dumps(spec))
        return ["--preload", "dasktune.cluster._adaptive", "--dasktune-pool", str(path)]

    def _pool_workers(self) -> list[dict[str, Any]]:
        """The worker processes the adaptive pool recorded (none without a pool)."""
        try:
            return json.loads(self._pool_records.read_text())
        except (FileNotFoundError, ValueError):
            return []

    def _stop_pool(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        """Every process of the cluster, after the pool (if any) stopped adapting, so that
        none starts while they are stopped."""
        procs = list(state.get("processes", []))
        sched = [r for r in procs if r["role"] == "scheduler"]
        if not (self._pool_records.exists() and sched and all(process_alive(r) for r in sched)):
            return procs + self._pool_workers()
        try:
            with self.connect(timeout=5.0) as client:
                client.run_on_scheduler(stop_pool)
        except Exception:  # noqa: BLE001 - an unresponsive scheduler: stop it first
            stop_processes(sched)
        return procs + self._pool_workers()

    def _start_workers(self, state: dict[str, Any], count: int) -> None:
        """Start ``count`` more workers, each recorded in the state file as it starts."""
        address, tls = state["scheduler_address"], state.get("tls")
        tls_args = _tls_args(tls)
        node = self.config.worker
        nthreads = int(node.resources.get("CPU", 1))
        extra_res = {k: v for k, v in node.resources.items() if k != "CPU"}
        command = self.config.worker_command
        for _ in range(count):
            wname = f"{self.name}-worker-{uuid.uuid4().hex[:6]}"
            argv = (list(command) + [address] if command else
                    worker_command(address, nthreads=nthreads, name=wname, resources=extra_res))
            rec = self._spawn(argv + tls_args, "worker", f"{wname}.log")
            rec["name"] = wname
            state["processes"].append(rec)
            self.state.write(state)

    def _top_up(self, state: dict[str, Any], timeout: float,
                progress: Progress) -> dict[str, Any]:
        """``up`` on a running cluster: replace workers that died, keep the rest."""
        state["processes"] = [r for r in state["processes"] if process_alive(r)]
        live = sum(r["role"] == "worker" for r in state["processes"])
        # The pool replaces the workers that died by itself.
        missing = 0 if self._pooled else max(0, self._n_workers - live)
        progress(f"cluster {self.name!r} is already up at {state['scheduler_address']}; "
                 f"starting {missing} worker(s)")
        self._start_workers(state, missing)
        self.wait_for_workers(self._n_workers, timeout, progress)
        return state

    def _wait_scheduler_file(self, path: Any, rec: dict[str, Any], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                try:
                    return json.loads(path.read_text())
                except ValueError:  # being written
                    pass
            if not process_alive(rec):
                raise RuntimeError(f"the scheduler exited; see {rec['log']}")
            time.sleep(0.05)
        raise TimeoutError(f"the scheduler did not start within {timeout:.0f}s; see {rec['log']}")

    def down(self, *, progress: Progress = quiet) -> None:
        if not self.state.exists():
            progress(f"cluster {self.name!r} is not up; nothing to do")
            return
        state = self.state.read()
        stop_processes(state.get("jobs", []))  # no driver asks for workers while the pool stops
        procs = self._stop_pool(state)
        progress(f"stopping {len(procs)} process(es)")
        _stop_all(procs)
        self.state.remove()

    def kill_worker_hard(self, *, rng: random.Random | None = None) -> str:
        state = self.state.read()
        live = [r for r in state["processes"] + self._pool_workers()
                if r["role"] == "worker" and process_alive(r)]
        if not live:
            raise ValueError(f"cluster {self.name!r} has no live worker process")
        victim = (rng or random).choice(live)
        stop_processes([victim], sig=signal.SIGKILL)
        return f"{victim.get('name', 'worker')} (PID {victim['pid']})"

    def exec(self, command: str) -> int:
        self.state.read()  # the cluster must be up
        return subprocess.call(command, shell=True, env={**os.environ, **self.client_env()})

    def _driver_argv(self, script: str, args: Sequence[str]) -> list[str]:
        if not os.path.isfile(script):
            raise ValueError(f"submit: no such script: {script}")
        return [sys.executable, os.path.abspath(script), *args, "--address", self.address]

    def submit(self, script: str, args: Sequence[str], *, detach: bool = False,
               then_down: bool = False) -> tuple[int, str | None]:
        argv = self._driver_argv(script, args)
        env = self.client_env()
        if not detach:
            return subprocess.call(argv, env={**os.environ, **env}), None
        if then_down:
            down = dasktune_command("down", "-y", "--name", self.name, self._config_path())
            argv = ["/bin/sh", "-c", f"{shlex.join(argv)}; {shlex.join(down)}"]
        job = f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        rec = self._spawn(argv, "job", f"{job}.log", env=env)
        rec["job"] = job
        state = self.state.read()
        state.setdefault("jobs", []).append(rec)
        self.state.write(state)
        return 0, job

    def _config_path(self) -> str:
        path = self.state.read().get("config_path")
        if not path:
            raise ValueError("--stop with --detach needs the cluster file path; "
                             "bring the cluster up with `dasktune up` first")
        return path

    def _job(self, job: str | None) -> dict[str, Any]:
        jobs = self.state.read().get("jobs", [])
        if not jobs:
            raise ValueError(f"cluster {self.name!r} has no detached job")
        if job is None:
            return jobs[-1]
        for rec in jobs:
            if rec["job"] == job:
                return rec
        raise ValueError(f"no job {job!r} on cluster {self.name!r} "
                         f"(jobs: {', '.join(r['job'] for r in jobs)})")

    def logs(self, job: str | None = None) -> tuple[str, bool]:
        rec = self._job(job)
        with open(rec["log"], errors="replace") as f:
            return f.read(), process_alive(rec)

    def jobs(self) -> list[tuple[str, bool]]:
        """The submitted driver jobs and whether each is still running."""
        return [(r["job"], process_alive(r)) for r in self.state.read().get("jobs", [])]
