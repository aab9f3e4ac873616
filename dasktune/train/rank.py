"""One rank's process: connect to the controller, set up ``torch.distributed``, run the
user's ``train_loop_per_worker``, tear down, exit.

Started by :func:`dasktune.train.launcher.run_rank` with the rank's environment already
set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, ``CUDA_VISIBLE_DEVICES``). The process group is gloo
on CPU and nccl on GPU, initialised before the user's loop and destroyed after it, so
the worker is clean for the next trial.

The process never outlives its controller: a thread reads the controller's connection
and exits the process the moment it closes (the driver function is gone, or it stopped
the group), even while the main thread sits in a collective; and it dies with the task
that started it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import datetime
import inspect
import os
import threading
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any

import cloudpickle

from dasktune import child_process
from dasktune.train import context
from dasktune.train.context import RankInfo, RankSession

__all__ = ["main"]


def main(host: str, port: str, authkey: str, rank: str, parent_pid: str) -> None:
    """Entry point (through :func:`dasktune.child_process.spawn`)."""
    child_process.die_with_parent(int(parent_pid))
    conn = Client((host, int(port)), authkey=bytes.fromhex(authkey))
    conn.send(("rank", int(rank), os.getpid()))
    info, loop_blob, loop_config = cloudpickle.loads(conn.recv_bytes())
    session = RankSession(info, _PicklingConnection(conn))
    context.bind(session)
    finishing = threading.Event()
    threading.Thread(target=_watch_controller, args=(conn, session, finishing), daemon=True,
                     name="dasktune-train-controller-watch").start()
    error = None
    dist = None
    try:
        dist = _init_process_group(info)
        _call(cloudpickle.loads(loop_blob), loop_config)
    except BaseException:  # noqa: BLE001 - the rank's error, for the controller
        error = traceback.format_exc()
    if error is None and dist is not None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the process exits next anyway
            pass
    finishing.set()
    try:
        session.send(("done", error))
    except OSError:
        pass
    child_process.exit_now()  # the rank is over


class _PicklingConnection:
    """The controller's connection, sending with cloudpickle (metrics may hold what
    pickle cannot); the session serialises the sends."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def send(self, obj: Any) -> None:
        self._conn.send_bytes(cloudpickle.dumps(obj))


def _watch_controller(conn: Connection, session: RankSession,
                      finishing: threading.Event) -> None:
    """Hand the controller's answers to ``train.report``; exit when it goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0 if finishing.is_set() else child_process.ORPHAN_EXIT)
        if msg[0] == "ack":
            session.on_ack(msg[1], msg[2])
        elif msg[0] == "flush":
            try:
                session.send_through(msg[1])
            except OSError:
                pass  # the controller went: the next recv ends the process
        elif msg[0] == "notice":
            session.notices.put((msg[1], msg[2]))
        elif msg[0] == "kill":
            os._exit(child_process.ORPHAN_EXIT)


def _init_process_group(info: RankInfo) -> Any:
    """``torch.distributed`` for this rank (None if torch is not installed and the
    group has one rank: nothing to set up)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        if info.world_size == 1:
            return None
        raise ImportError("a TorchTrainer with several workers needs PyTorch: "
                          'pip install "dasktune[torch]"') from None
    # A forked rank's OpenMP was set up in its fork server, before this rank's thread
    # count (its reserved CPUs: ``child_process.child_env``) was in its environment.
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    backend = info.backend
    if backend == "nccl":
        torch.cuda.set_device(0)  # the rank sees exactly its own device
    dist.init_process_group(backend=backend, init_method="env://", rank=info.world_rank,
                            world_size=info.world_size,
                            timeout=datetime.timedelta(seconds=info.timeout_s))
    return dist


def _call(fn: Any, config: dict[str, Any] | None) -> Any:
    """Ray's rule: the loop takes the config if it has a parameter, else nothing."""
    try:
        takes_config = bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        takes_config = True
    return fn(config if config is not None else {}) if takes_config else fn()
