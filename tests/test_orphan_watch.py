"""The embedded cluster's worker preload (dasktune.orphan_watch) ends a worker whose
driver died while the worker was starting: it watches the driver PID it was given, not
whatever the nanny's parent is by then (PID 1 for a driver already gone)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from dasktune import orphan_watch


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_worker_whose_driver_died_before_its_preload_leaves_with_its_nanny():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # The "nanny" is a child of this test, so its parent is alive and is not the driver
    # named to its "worker": the preload must act on the name it was given.
    worker = ("import time; from dasktune import orphan_watch; "
              "orphan_watch.dask_setup(None); time.sleep(120)")
    nanny_code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = dict(os.environ, {orphan_watch.DRIVER_PID_ENV}="{dead.pid}")
        child = subprocess.Popen([sys.executable, "-c", {worker!r}], env=env)
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    nanny = subprocess.Popen([sys.executable, "-c", nanny_code], stdout=subprocess.PIPE,
                             text=True)
    worker_pid = 0
    try:
        worker_pid = int(nanny.stdout.readline())
        assert nanny.wait(timeout=60) == -9, "the orphaned worker did not end its nanny"
        deadline = time.monotonic() + 30
        while not _gone(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(worker_pid), "the orphaned worker did not exit"
    finally:
        for pid in (nanny.pid, worker_pid):
            if pid and not _gone(pid):
                psutil.Process(pid).kill()
