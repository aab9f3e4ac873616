"""Ends an embedded cluster's worker at once, quietly, when the driver that started it dies.

The embedded cluster's scheduler lives in the user's process; its workers are ``dask spec``
processes (a nanny) started by that process, each with its worker process. When the driver
is killed (SIGKILL, the OOM killer), nothing tells them: they would linger and print
``Failed to communicate with scheduler during heartbeat`` tracebacks into the user's
terminal. This worker preload (set by :mod:`dasktune.runtime`) watches the driver, the
nanny's parent, and once it is gone kills the nanny and the worker's own children and
exits without a word: nothing is left to report to.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

__all__ = ["DRIVER_PID_ENV", "dask_setup", "watch"]

#: Set by :mod:`dasktune.runtime` in each worker's environment: the driver's PID.
DRIVER_PID_ENV = "DASKTUNE_DRIVER_PID"

#: How often the parent is looked for: the longest an orphan lives.
POLL_S = 0.1


def _end_quietly(nanny: psutil.Process) -> None:
    """Kill the nanny's other processes (the resource tracker, trial processes) and the
    nanny, then exit."""
    me = os.getpid()
    try:
        victims = [p for p in nanny.children(recursive=True) if p.pid != me] + [nanny]
    except psutil.Error:
        victims = [nanny]
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    os._exit(0)  # no atexit, no close handshake with a scheduler that is gone


class _SilentOnceOrphaned(logging.Filter):
    """Drops the worker's log records once the driver is gone: a heartbeat in flight
    fails at the very moment of the kill, before the watch thread notices."""

    def __init__(self, alive: Callable[[], bool]) -> None:
        super().__init__()
        self.alive = alive

    def filter(self, record: logging.LogRecord) -> bool:
        return self.alive()


def watch(alive: Callable[[], bool], on_gone: Callable[[], Any]) -> threading.Thread:
    """Call ``on_gone`` (from a daemon thread) once ``alive()`` is false."""

    def run() -> None:
        while alive():
            time.sleep(POLL_S)
        on_gone()

    thread = threading.Thread(target=run, name="dasktune-orphan-watch", daemon=True)
    thread.start()
    return thread


def dask_setup(worker: Any) -> None:
    """The worker preload hook: watch the driver, which started this worker's nanny."""
    nanny = psutil.Process(os.getppid())
    # The PID the driver gave us: a driver that died while this worker started has left
    # the nanny to PID 1 already, and taking the nanny's parent now would watch that.
    driver = int(os.environ.get(DRIVER_PID_ENV) or nanny.ppid())

    def alive() -> bool:
        try:  # the nanny still has its driver for a parent (and is not a zombie)
            return nanny.ppid() == driver and nanny.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    silent = _SilentOnceOrphaned(alive)
    for handler in logging.getLogger("distributed").handlers + logging.getLogger().handlers:
        handler.addFilter(silent)
    watch(alive, lambda: _end_quietly(nanny))
