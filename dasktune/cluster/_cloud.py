"""What AWS and GCP share: start through dask-cloudprovider with a bounded wait, keep the
VMs after the command exits, and run head-node work through the scheduler process."""

from __future__ import annotations

import asyncio
import os
import random
import shlex
import time
from collections.abc import Sequence
from typing import Any

from dasktune.cluster._base import ClusterProvider, Progress, _quiet

__all__ = ["CloudProvider", "check_cli_options"]

TAG = "dasktune-cluster"


def check_cli_options(options: dict[str, Any], where: str) -> dict[str, Any]:
    """dask-cloudprovider renders scheduler/worker options with ``str()`` on a command line,
    so a list would arrive as ``"['a', 'b']"``: refuse it here, with its name."""
    for key, value in options.items():
        if isinstance(value, (list, tuple, dict, set)):
            raise ValueError(f"{where}.{key}: only scalar values can be passed "
                             f"(dask-cloudprovider renders them with str()), got {value!r}")
    return options


class CloudProvider(ClusterProvider):
    """Subclasses say how to build the dask-cloudprovider cluster and how to find and
    terminate this cluster's instances by their tag (so ``down`` works after a partial ``up``)."""

    def cluster_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def cluster_class(self) -> type:
        raise NotImplementedError

    def instances(self, *, role: str | None = None) -> list[str]:
        """Ids of this cluster's live instances (``role``: "scheduler" or "worker")."""
        raise NotImplementedError

    def terminate(self, ids: Sequence[str]) -> None:
        raise NotImplementedError

    @property
    def spot(self) -> bool:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------
    def up(self, *, restart_only: bool = False, timeout: float = 600.0,
           progress: Progress = _quiet) -> dict[str, Any]:
        if restart_only:
            state = self.state.read()
            with self.connect() as client:
                client.restart_workers(list(client.scheduler_info(n_workers=-1)["workers"]))
            return state
        if self.state.exists() and self.instances():
            progress(f"cluster {self.name!r} is already up")
            return self.state.read()
        self.state.write({"name": self.name, "provider": self.kind})
        deadline = time.monotonic() + timeout
        try:
            progress(f"creating the scheduler and {self.config.min_workers} worker VM(s)")
            info = asyncio.run(self._create(timeout))
            self.state.update(**info)
            n = self.config.min_workers
            self.wait_for_workers(n, max(1.0, deadline - time.monotonic()), progress)
            if self.spot:
                self._install_spot_plugin()
        except BaseException as e:
            progress("up failed; terminating what was created")
            self.down()
            if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
                raise TimeoutError(f"cluster {self.name!r}: not up within {timeout:.0f}s "
                                   "(no scheduler answered?); nothing is left running") from None
            raise
        if self.config.adaptive:
            progress(f"note: started min_workers={n}; adaptive scaling to max_workers needs a "
                     "manager process and is not kept after `up` exits")
        return self.state.read()

    def _install_spot_plugin(self) -> None:
        """Every worker, now and later, watches its VM's interruption notice."""
        import dask.config
        from dask.utils import parse_timedelta

        from dasktune.cluster.spot import SpotInterruptionPlugin

        url = dask.config.get("dasktune.cluster.spot-notice-url", None)
        interval = dask.config.get("dasktune.cluster.spot-poll-interval", "5s")
        plugin = SpotInterruptionPlugin(url=url, provider=self.kind,
                                        interval=parse_timedelta(interval, default="s"))
        with self.connect() as client:
            client.register_plugin(plugin)

    async def _create(self, timeout: float) -> dict[str, Any]:
        cls = self.cluster_class()
        cluster = cls(asynchronous=True, shutdown_on_close=False, **self.cluster_kwargs())

        async def start() -> None:
            await cluster._start()
            # Create the worker VMs now: a background scale would die with this command.
            await cluster._correct_state()

        await asyncio.wait_for(start(), timeout)
        info: dict[str, Any] = {"scheduler_address": cluster.scheduler_address}
        host = cluster.scheduler_address.split("://")[-1].rsplit(":", 1)[0]
        info["dashboard_url"] = f"http://{host}:8787/status"
        sec = cluster.security
        if sec is not None and sec.require_encryption:
            files = {}
            for key, pem in (("ca", sec.tls_ca_file), ("cert", sec.tls_client_cert),
                             ("key", sec.tls_client_key)):
                path = self.state.private_file(f"tls-{key}.pem")
                path.write_text(pem)
                files[key] = str(path)
            info["tls"] = files
        # Deliberately not closed: the VMs outlive this command; `down` terminates them.
        return info

    def down(self, *, progress: Progress = _quiet) -> None:
        ids = self.instances()
        if ids:
            progress(f"terminating {len(ids)} instance(s): {', '.join(ids)}")
            self.terminate(ids)
        left = self.instances()
        if left:
            raise RuntimeError(f"instances still running after terminate: {left}")
        self.state.remove()

    def kill_worker_hard(self, *, rng: random.Random | None = None) -> str:
        ids = self.instances(role="worker")
        if not ids:
            raise ValueError(f"cluster {self.name!r} has no running worker instance")
        victim = (rng or random).choice(ids)
        self.terminate([victim])
        return f"instance {victim}"

    # -- head-node work, through the scheduler process -------------------------------------
    def exec(self, command: str) -> int:
        with self.connect() as client:
            code, out = client.run_on_scheduler(_run_shell, command)
        print(out, end="")
        return code

    def submit(self, script: str, args: Sequence[str], *, detach: bool = False,
               then_down: bool = False) -> tuple[int, str | None]:
        if not os.path.isfile(script):
            raise ValueError(f"submit: no such script: {script}")
        with open(script, "rb") as f:
            body = f.read()
        if then_down and detach:
            raise ValueError("--stop with --detach is only supported on local clusters")
        argv = [*args, "--address", self.address]
        with self.connect() as client:
            code, out, job = client.run_on_scheduler(
                _run_driver, os.path.basename(script), body, argv, detach)
        if out:
            print(out, end="")
        if job:
            self.state.update(jobs=[*self.state.read().get("jobs", []), job])
        return code, job

    def logs(self, job: str | None = None) -> tuple[str, bool]:
        jobs = self.state.read().get("jobs", [])
        if not jobs:
            raise ValueError(f"cluster {self.name!r} has no detached job")
        job = job or jobs[-1]
        with self.connect() as client:
            return client.run_on_scheduler(_read_job, job)


def _jobs_dir() -> str:
    path = os.path.expanduser("~/.dasktune/jobs")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


async def _run_shell(command: str) -> tuple[int, str]:
    """On the head: run a shell command, return (status, output).

    A coroutine so that Dask awaits it on the scheduler's event loop instead of calling it
    there: a blocking call would freeze the scheduler for as long as the command runs.
    """
    proc = await asyncio.create_subprocess_shell(
        command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode(errors="replace")


# Runs the job and then records its exit status: the scheduler never waits on a detached
# job, so its process stays an unreaped zombie that a PID check would take for alive.
_RECORD_RC = ("import os, subprocess, sys\n"
              "rc = subprocess.call(sys.argv[2:])\n"
              "with open(sys.argv[1] + '.tmp', 'w') as f:\n"
              "    f.write(str(rc))\n"
              "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n")


async def _run_driver(name: str, body: bytes, argv: list[str],
                      detach: bool) -> tuple[int, str, str | None]:
    """On the head: write the script and run it (detached: in its own session, logged).

    A coroutine, as :func:`_run_shell`: the driver connects back to this very scheduler,
    which must keep serving while it waits for the driver to end.
    """
    import subprocess
    import sys
    import uuid

    job = f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    folder = os.path.join(_jobs_dir(), job)
    os.makedirs(folder, mode=0o700)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(body)
    cmd = [sys.executable, path, *argv]
    if not detach:
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=folder, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return int(proc.returncode or 0), out.decode(errors="replace"), None
    log = os.open(os.path.join(folder, "output.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    wrapped = [sys.executable, "-c", _RECORD_RC, os.path.join(folder, "rc"), *cmd]
    proc = subprocess.Popen(wrapped, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(log)
    with open(os.path.join(folder, "pid"), "w") as f:
        # With its start time, so a reused PID is not taken for the job.
        f.write(f"{proc.pid} {_create_time(proc.pid)}")
    return 0, f"started {shlex.join(cmd)}\n", job


def _read_job(job: str) -> tuple[str, bool]:
    """On the head: (the job's output so far, whether it still runs)."""
    import psutil

    folder = os.path.join(_jobs_dir(), job)
    with open(os.path.join(folder, "output.log"), errors="replace") as f:
        text = f.read()
    if os.path.exists(os.path.join(folder, "rc")):
        return text, False
    with open(os.path.join(folder, "pid")) as f:
        pid_s, _, created = f.read().partition(" ")
    try:
        # No rc file yet: the wrapper is running, or was killed; a zombie has ended.
        proc = psutil.Process(int(pid_s))
        running = (proc.status() != psutil.STATUS_ZOMBIE
                   and (not created or abs(proc.create_time() - float(created)) < 1.0))
    except psutil.NoSuchProcess:
        running = False
    return text, running


def _create_time(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return time.time()
