"""The Dask task that starts one rank's process on its worker, watches it and kills it.

The controller submits one :func:`run_rank` per rank, pinned to the rank's worker.
The task leaves the worker's thread pool at once (``secede``: it only waits), connects
to the controller, and on the controller's word starts the rank's process
(:mod:`dasktune.train.rank`) with the rank's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``... and ``CUDA_VISIBLE_DEVICES``), forked by the worker's warm fork server
(:mod:`dasktune.train.forkserver`) where there is one. Then it waits: it reports the
process's exit to the controller, and kills the process by its PID, on this worker,
when the controller says so or goes away. The rank's process also dies with its parent --
the fork server, which dies with the worker, or this task's thread (``PR_SET_PDEATHSIG``,
as an isolated trial's does) -- so a lost worker leaves no rank behind.
"""

from __future__ import annotations

import logging
import os
import socket
from multiprocessing.connection import Client, Connection
from typing import Any

from distributed import secede

from dasktune import child_process, isolation
from dasktune.train import forkserver

__all__ = ["free_port", "run_rank"]

logger = logging.getLogger(__name__)

_POLL_S = 0.1
_ENTRY = "dasktune.train.rank:main"


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (for rank 0's ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_rank(controller: tuple[str, int], authkey: bytes, rank: int, host: str) -> int | None:
    """Run rank ``rank`` on this worker (``host`` its address); its exit code, or None
    when the controller called it off before it started."""
    secede()  # a long wait, not work: the worker's thread goes back to its tasks
    conn = Client(controller, authkey=authkey)
    try:
        conn.send(("launcher", rank, os.getpid(), free_port(host) if rank == 0 else None))
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return None
        if msg[0] != "start":
            return None
        env: dict[str, str] = msg[1]
        devices: list[str] = msg[2]
        cpus: float = msg[3]
        proc = _start(controller, authkey, rank,
                      {**child_process.child_env(isolation.child_devices(devices), cpus), **env},
                      gpus=bool(devices))
        conn.send(("child", rank, proc.pid))
        return _watch(conn, proc, rank)
    finally:
        conn.close()


def _start(controller: tuple[str, int], authkey: bytes, rank: int,
           env: dict[str, str], gpus: bool) -> Any:
    """The rank's process: forked by this worker's fork server, or (with GPUs, or where
    the server is off or failed) a fresh interpreter. Either way it dies with its parent
    (its last argument)."""
    args = [controller[0], str(controller[1]), authkey.hex(), str(rank)]
    server = forkserver.for_this_process(gpus)
    if server is not None:
        try:
            return server.start(_ENTRY, [*args, str(server.pid)], env)
        except (OSError, RuntimeError) as exc:
            logger.warning("rank %d: the fork server failed (%s); starting a fresh "
                           "interpreter", rank, exc)
    return child_process.spawn(_ENTRY, [*args, str(os.getpid())], env)


def _watch(conn: Connection, proc: Any, rank: int) -> int:
    """Wait for the rank's process; kill it when the controller says so or goes away."""
    while True:
        code = proc.poll()
        if code is not None:
            try:
                conn.send(("exit", rank, code))
            except OSError:
                pass
            return int(code)
        try:
            if not conn.poll(_POLL_S):
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            msg = ("kill",)  # the controller is gone: no rank outlives it
        if msg[0] == "kill":
            proc.kill()
            return int(proc.wait())
