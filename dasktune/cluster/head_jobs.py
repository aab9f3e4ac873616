"""Jobs on a cloud cluster's head node, run by its scheduler process.

``dasktune exec`` and ``dasktune submit`` send these functions to the scheduler with
``client.run_on_scheduler``: a shell command (:func:`run_shell`), a driver script started
in its own session with its output in a log file and its exit status recorded by a small
wrapper (:func:`start_driver`), that output read by offset with a long poll
(:func:`read_job`), and the job's process group stopped (:func:`stop_job`). The jobs live
under ``~/.dasktune/jobs/<job>`` on the head. The coroutines run on the scheduler's event
loop without blocking it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

__all__ = ["read_job", "run_shell", "start_driver", "stop_job"]


def _jobs_dir() -> str:
    path = os.path.expanduser("~/.dasktune/jobs")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


async def run_shell(command: str) -> tuple[int, str]:
    """On the head: run a shell command, return (status, output).

    A coroutine so that Dask awaits it on the scheduler's event loop instead of calling it
    there: a blocking call would freeze the scheduler for as long as the command runs.
    """
    proc = await asyncio.create_subprocess_shell(
        command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode(errors="replace")


# Runs the job and then records its exit status: the scheduler never waits on a job, so
# its process stays an unreaped zombie that a PID check would take for alive.
_RECORD_RC = ("import os, subprocess, sys\n"
              "rc = subprocess.call(sys.argv[2:])\n"
              "with open(sys.argv[1] + '.tmp', 'w') as f:\n"
              "    f.write(str(rc))\n"
              "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n")


def start_driver(name: str, body: bytes, argv: list[str]) -> tuple[str, str]:
    """On the head: write the script and start it in its own session, its output going to
    the job's log file; (job id, the command line)."""
    import shlex
    import subprocess
    import uuid

    job = f"job-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    folder = os.path.join(_jobs_dir(), job)
    os.makedirs(folder, mode=0o700)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(body)
    # Unbuffered, so that a follower sees each line as the driver prints it.
    cmd = [sys.executable, "-u", path, *argv]
    log = os.open(os.path.join(folder, "output.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    wrapped = [sys.executable, "-c", _RECORD_RC, os.path.join(folder, "rc"), *cmd]
    proc = subprocess.Popen(wrapped, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(log)
    with open(os.path.join(folder, "pid"), "w") as f:
        # With its start time, so a reused PID is not taken for the job.
        f.write(f"{proc.pid} {_create_time(proc.pid)}")
    return job, shlex.join(cmd)


_READ_LIMIT = 1 << 20  # bytes per answer: a chatty driver is read in several


async def read_job(job: str, offset: int = 0, wait: float = 0.0,
                    limit: int | None = _READ_LIMIT) -> tuple[bytes, bool, int | None]:
    """On the head: (the job's output after ``offset``, whether more may come, its exit
    status once ended). Waits up to ``wait`` seconds for output or the end.

    A coroutine, as :func:`run_shell`, so waiting does not hold up the scheduler.
    """
    folder = os.path.join(_jobs_dir(), job)
    log = os.path.join(folder, "output.log")
    deadline = time.monotonic() + wait
    while True:
        # The end first, then the output: what a job printed precedes its end.
        ended, rc = _ended(folder)
        if ended or os.path.getsize(log) > offset or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    with open(log, "rb") as f:
        f.seek(offset)
        chunk = f.read(limit if limit is not None else -1)
    more = limit is not None and len(chunk) == limit
    return chunk, not ended or more, rc if ended and not more else None


def _ended(folder: str) -> tuple[bool, int | None]:
    """(whether the job in ``folder`` ended, its exit status when it recorded one)."""
    try:
        with open(os.path.join(folder, "rc")) as f:
            return True, int(f.read())
    except FileNotFoundError:
        pass
    # No rc file yet: the wrapper is running, or was killed; a zombie has ended.
    return _wrapper(folder) is None, None


def _wrapper(folder: str) -> Any:
    """The job's live wrapper process (``psutil.Process``), or None."""
    import psutil

    with open(os.path.join(folder, "pid")) as f:
        pid_s, _, created = f.read().partition(" ")
    try:
        proc = psutil.Process(int(pid_s))
        if proc.status() != psutil.STATUS_ZOMBIE and (
                not created or abs(proc.create_time() - float(created)) < 1.0):
            return proc
    except psutil.NoSuchProcess:
        pass
    return None


async def stop_job(job: str, grace: float = 5.0) -> bool:
    """On the head: SIGTERM the job's process group (wrapper and driver), SIGKILL it after
    ``grace`` seconds; whether it was running."""
    import signal

    folder = os.path.join(_jobs_dir(), job)
    proc = _wrapper(folder)
    if proc is None:
        return False
    pgid = proc.pid  # start_new_session made the wrapper its group's leader
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while _group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if not _group_alive(pgid):
            break
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs; reaps the wrapper (our child)."""
    import psutil

    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _create_time(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return time.time()
