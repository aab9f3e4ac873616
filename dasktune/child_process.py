"""The life of dasktune's child interpreters: start one, with what environment, end it,
read how it ended.

Three kinds of child run trial code: a trial given GPUs (:mod:`dasktune.isolation`), a
worker's rank fork server (:mod:`dasktune.train.forkserver`) and a training rank
(:mod:`dasktune.train.rank`). Each is a fresh interpreter started by :func:`spawn`
(``subprocess``, not ``multiprocessing``: Dask's nanny workers are daemonic processes,
which ``multiprocessing`` forbids to have children), never outlives the process that
started it (:func:`die_with_parent`, and its own watch on the connection to its parent),
and leaves at once when its work is over (:func:`exit_now`). Its environment is its
worker's, less what Dask's nanny set for the worker process alone (:func:`child_env`).

This module imports nothing heavy (``dask.config``, which ``import dasktune`` loads
anyway, but not ``distributed``): a child imports it first thing, and what a rank
imports before its first step is start-up time.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from typing import NoReturn

import dask.config

from dasktune import scratch

__all__ = ["ORPHAN_EXIT", "child_env", "describe_exit", "die_with_parent", "exit_now", "reap",
           "spawn", "threads_for"]

ORPHAN_EXIT = 70  # exit status of a child whose parent (or controller) went away

# The child's first line: this process's import path, then ``module:function(*args)``.
_BOOT = ("import importlib, json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "m, f = sys.argv[2].split(':'); getattr(importlib.import_module(m), f)(*sys.argv[3:])")


# What Dask's nanny sets for its worker process alone (``distributed.nanny.pre-spawn-environ``)
# and a child that runs trial code must not inherit:
# - glibc handing freed memory back to the OS from 64 KiB on, which Dask's memory manager
#   counts on. A training process is no Dask worker, and pays for it at every step: the
#   benchmark's DDP loop in plain torch takes 20% longer per step with it (2.70 -> 3.25 ms);
_WORKER_ONLY_ENVIRON = ("MALLOC_TRIM_THRESHOLD_",)
# - one math-library thread, for a worker whose task threads share its cores. A child
#   that reserved n CPUs gets n, as Ray sets ``OMP_NUM_THREADS`` for what reserved them.
_THREAD_CAPS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads_for(cpus: float) -> int:
    """The math-library threads of a child that reserved ``cpus`` CPUs (at least 1)."""
    return max(1, int(cpus))


def child_env(devices: list[str], cpus: float | None = None) -> dict[str, str]:
    """The environment of a child that runs trial code: this process's, seeing exactly
    ``devices``, its temp files where Dask cleans up after a crash, and without what
    Dask's nanny set for its worker process only: no malloc tuning, and ``cpus`` threads
    (:func:`threads_for`) where given. A value the user gave those variables is kept."""
    env = dict(os.environ)
    nanny_set = dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}
    from_nanny = {key for key, value in nanny_set.items() if env.get(key) == str(value)}
    for key in _WORKER_ONLY_ENVIRON:
        if key in from_nanny:
            del env[key]
    if cpus is not None:
        for key in _THREAD_CAPS:
            if key in from_nanny or key not in env:
                env[key] = str(threads_for(cpus))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if root := scratch.root():
        env["TMPDIR"] = root
    return env


def spawn(entry: str, args: list[str], env: dict[str, str],
          pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """Start a fresh interpreter that calls ``entry`` (``"module:function"``) with the
    string ``args``, on this process's import path (a fresh interpreter, not
    ``multiprocessing``: see the module docs)."""
    return subprocess.Popen(
        [sys.executable, "-c", _BOOT, json.dumps([p for p in sys.path if isinstance(p, str)]),
         entry, *args],
        env=env, pass_fds=pass_fds, cwd=os.getcwd(),
    )


def reap(proc: subprocess.Popen[bytes], grace: float) -> int:
    """Wait up to ``grace`` s for the child, then terminate it (then kill); its exit code."""
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    proc.terminate()
    try:
        return proc.wait(2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def describe_exit(code: int | None) -> str:
    """How a child that ran trial code ended, for the trial's error (``code`` is its
    ``Popen.returncode``: negative for a signal)."""
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    if code == ORPHAN_EXIT:
        return f"exited with code {code} (it lost contact with the worker)"
    return f"exited with code {code} before the trial finished"


def exit_now(code: int = 0) -> NoReturn:
    """End a child process whose work is over: flush its output, then leave at once with
    ``code``, with no atexit handlers and no waits on threads the user's code left running."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when its parent thread dies; exit if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # the socket watchdog still covers a vanished parent
    if os.getppid() != parent_pid:
        os._exit(ORPHAN_EXIT)
