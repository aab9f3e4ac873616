"""When a worker retires ahead of its ends (a batch job's time limit, its ``--lifetime``):
the rule of :func:`dasktune.cluster.walltime.retire_time`, its warning where a short lifetime
caps the margin, and the lifetime it reads from a real distributed ``Worker``. The moves themselves run on real processes in
``tests/test_faults_workers.py`` (a lifetime) and ``tests/test_slurm.py`` (a job)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import psutil
import pytest

from dasktune.cluster.walltime import (
    LIFETIME_SERVED,
    lifetime_lead,
    retire_time,
    worker_lifetime,
)


def test_job_end_alone_retires_a_margin_before_it():
    assert retire_time(60.0, job_end=1000.0) == 940.0
    assert retire_time(0.0, job_end=1000.0) == 1000.0
    assert retire_time(60.0) is None  # no end known: nothing to retire for


def test_a_long_lifetime_gets_the_full_margin():
    # started at 100, lives an hour: retire a minute before 3700
    assert retire_time(60.0, lifetime=(100.0, 3600.0)) == 3640.0


def test_a_short_lifetime_is_served_three_quarters_at_least():
    # 30 s lifetime, 20 s margin: the margin would retire it at 10 s; it serves 22.5 s
    assert LIFETIME_SERVED == 0.75
    assert retire_time(20.0, lifetime=(0.0, 30.0)) == 22.5
    # a lifetime shorter than the margin: the same quarter, never before the worker began
    assert retire_time(60.0, lifetime=(0.0, 12.0)) == 9.0
    # the cap meets the margin at four margins' lifetime
    assert retire_time(20.0, lifetime=(0.0, 80.0)) == 60.0
    assert lifetime_lead(20.0, 30.0) == 7.5 and lifetime_lead(20.0, 3600.0) == 20.0


def test_the_earlier_end_wins():
    # a job ending at 600 with a lifetime of 1000 from 0: the job's margin rules
    assert retire_time(60.0, job_end=600.0, lifetime=(0.0, 1000.0)) == 540.0
    # dask-jobqueue's recipe: a lifetime below the job's walltime rules
    assert retire_time(60.0, job_end=3600.0, lifetime=(0.0, 3300.0)) == 3240.0
    # the lifetime's cap is not applied to the job's end
    assert retire_time(20.0, job_end=40.0, lifetime=(0.0, 30.0)) == 20.0


def test_lifetime_read_from_the_worker():
    now = time.time()
    started = psutil.Process().create_time()
    none = SimpleNamespace(lifetime=None, lifetime_restart=False, address="w")
    assert worker_lifetime(none) is None
    hour = SimpleNamespace(lifetime=3600.0, lifetime_restart=False, address="w")
    assert worker_lifetime(hour, now=started + 10) == (started, 3600.0)
    # --lifetime-restart: the nanny restarts the worker in place; Dask keeps that
    restart = SimpleNamespace(lifetime=3600.0, lifetime_restart=True, address="w")
    assert worker_lifetime(restart, now=started + 10) is None
    # a Worker built in a process older than its lifetime: its start is unknown
    assert worker_lifetime(hour, now=max(now, started + 3601)) is None


def test_lifetime_of_a_real_worker():
    """distributed's own attributes: ``Worker.lifetime`` (the stagger drawn into it) and
    ``Worker.lifetime_restart``."""
    from distributed import Scheduler, Worker

    async def run() -> tuple[object, object]:
        async with Scheduler(dashboard_address=":0", host="127.0.0.1") as s:
            async with Worker(s.address, lifetime="1h", lifetime_stagger="10s") as w:
                got = worker_lifetime(w, now=psutil.Process().create_time() + 1)
            async with Worker(s.address, lifetime="1h", lifetime_restart=True) as w:
                restarting = worker_lifetime(w)
            return got, restarting

    got, restarting = asyncio.run(asyncio.wait_for(run(), 60))
    assert got is not None and restarting is None
    start, seconds = got
    assert start == psutil.Process().create_time()
    assert seconds == pytest.approx(3600.0, abs=10.0)


def test_a_capped_margin_is_said_once_naming_both(caplog):
    """A lifetime under four margins: the worker's log says so, with both settings."""
    from distributed import Scheduler, Worker

    from dasktune.cluster.walltime import WalltimePlugin

    async def run() -> None:
        async with Scheduler(dashboard_address=":0", host="127.0.0.1") as s:
            for margin in (1000.0, 60.0):  # a quarter of an hour is 900 s
                async with Worker(s.address, lifetime="1h", lifetime_stagger="0s") as w:
                    plugin = WalltimePlugin(margin=margin)
                    plugin.setup(w)
                    plugin.teardown(w)

    with caplog.at_level("WARNING", logger="dasktune.cluster.walltime"):
        asyncio.run(asyncio.wait_for(run(), 60))
    said = [r.getMessage() for r in caplog.records if "lifetime (3600s)" in r.getMessage()]
    assert len(said) == 1, said
    assert "dasktune.cluster.walltime.margin (1000s)" in said[0] and "900s before" in said[0]
