"""A warm interpreter per worker process that forks the training ranks.

A rank's process spends seconds importing ``torch`` and dasktune before its first step:
2.6 s of CPU on the 2-core development VM, paid again by every rank of every trial. So
on Linux each worker process keeps one *fork server*: a child interpreter that imported
``dasktune.train.rank`` and the modules of ``dasktune.train.forkserver-preload``
(``torch``, ``torch.distributed``, ``torch.nn.parallel`` and ``torch._dynamo``, which
``DistributedDataParallel`` imports on construction, by default) once, and forks a
rank process for each request, in milliseconds, sharing those pages copy-on-write. It
is Python's ``multiprocessing`` forkserver idea; ``multiprocessing`` itself is no option
here, as Dask's nanny workers are daemonic processes, which it forbids to have children.

Safety of ``fork`` after ``import torch``: the server runs no torch operation and starts
no thread (so no OpenMP pool exists yet), and each rank sets its own environment before
any of its code runs. CUDA is another matter: a CUDA runtime touched before a fork is
unusable after it, and an import may probe the devices. So the server sees no GPU
(``CUDA_VISIBLE_DEVICES=""``) and forks CPU ranks only; a rank given GPUs starts as a
fresh interpreter, as every rank did before (its steps, not its start, dominate).

Lifetimes, by the kernel, not by cleanup code:

* the server reads a pipe whose other end only its worker process holds, and exits when
  it closes (the worker exited or was killed), killing its live ranks first;
* each rank is killed by the kernel when the server dies (``PR_SET_PDEATHSIG``);
* each rank belongs to one connection to the server (its :class:`ForkedProcess`): the
  server kills the rank when that connection closes (its launcher is gone) and reports
  its exit code on it.

A trainer warms every worker's server as its ``fit()`` begins (:func:`warm_cluster`), so
the imports overlap the trial's set-up; a worker that has none when its first rank
starts starts one then. ``train.forkserver: false`` turns it off, as does a platform
other than Linux: each rank is then a fresh interpreter, as before.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from dasktune import _dask_config, child_process

__all__ = ["ForkServer", "ForkedProcess", "enabled", "for_this_process", "serve", "warm",
           "warm_cluster"]

logger = logging.getLogger(__name__)

_REAP_S = 0.1  # how often the server looks for ended ranks between requests


class ForkedProcess:
    """A rank forked by the server: ``subprocess.Popen``'s ``pid``, ``poll``, ``wait``,
    ``kill`` and ``returncode``, over the connection it was started on."""

    def __init__(self, conn: Connection, pid: int):
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (negative: the signal that killed it), or None while it runs."""
        return self.wait(0.0)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` s (None: for ever) for the exit code."""
        if self.returncode is None:
            try:
                if self._conn.poll(timeout):
                    self.returncode = int(self._conn.recv()[1])
            except (EOFError, OSError):
                # The server died, and the kernel killed its ranks with it.
                self.returncode = -signal.SIGKILL
            if self.returncode is not None:
                self._conn.close()
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the rank (the server does it: the PID cannot have been reused there)."""
        if self.returncode is None:
            with contextlib.suppress(OSError):
                self._conn.send(("kill",))


class ForkServer:
    """This worker process's fork server (one per process: :func:`for_this_process`)."""

    def __init__(self, preload: list[str]):
        self._dir = tempfile.mkdtemp(prefix="dasktune-fork-")  # 0700: only this user
        self.address = os.path.join(self._dir, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address)
        listener.listen(64)
        # The listening socket exists before the server does: a rank asked for while it
        # still imports waits in the backlog instead of failing to connect.
        lifeline_r, self._lifeline = os.pipe()
        try:
            self._proc = child_process.spawn(
                "dasktune.train.forkserver:serve",
                [str(listener.fileno()), str(lifeline_r), json.dumps(preload)],
                # No device to probe: see the module's notes on CUDA. (A rank's malloc
                # is the server's, set up as the server starts: hence a child's
                # environment here already, not only in the rank's own.)
                child_process.child_env([]),
                pass_fds=(listener.fileno(), lifeline_r))
        finally:
            listener.close()
            os.close(lifeline_r)

    @property
    def pid(self) -> int:
        """The server's PID: the parent of every rank it forks."""
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def start(self, entry: str, args: list[str], env: dict[str, str]) -> ForkedProcess:
        """Fork a process that calls ``entry`` (``"module:function"``) with ``args``, in
        ``env`` and this process's working directory."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.address)
        except OSError:
            sock.close()
            raise
        conn = Connection(sock.detach())
        try:
            conn.send(("start", entry, args, env, os.getcwd()))
            pid = conn.recv()[1]
        except (EOFError, OSError) as exc:
            conn.close()
            raise RuntimeError(f"the fork server (pid {self.pid}) did not start the "
                               f"process: {exc!r}") from None
        return ForkedProcess(conn, int(pid))

    def close(self) -> None:
        """Stop the server (its ranks die with it)."""
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        with contextlib.suppress(OSError):
            child_process.reap(self._proc, 5.0)
        shutil.rmtree(self._dir, ignore_errors=True)


_lock = threading.Lock()
_server: ForkServer | None = None


def enabled(gpus: bool = False) -> bool:
    """Whether ranks (given GPUs or not) are forked by a fork server here: on Linux, with
    ``dasktune.train.forkserver`` on, and only CPU ranks (see the notes on CUDA)."""
    return not gpus and sys.platform.startswith("linux") and \
        bool(_dask_config.get("train.forkserver"))


def for_this_process(gpus: bool = False) -> ForkServer | None:
    """This process's fork server for ranks given GPUs or not, started on first use
    (None where ranks get none: see :func:`enabled`)."""
    global _server
    if not enabled(gpus):
        return None
    with _lock:
        if _server is not None and not _server.alive():
            logger.warning("the rank fork server (pid %d) exited with code %s; starting "
                           "another", _server.pid, _server._proc.returncode)
            _server.close()
            _server = None
        if _server is None:
            _server = ForkServer(list(_dask_config.get("train.forkserver-preload") or []))
        return _server


async def warm() -> None:
    """Start this worker process's fork server now if it has none, so that it imports
    while a trial sets up (``client.run(warm, wait=False)``, which takes only coroutine
    functions: see :func:`warm_cluster`). Starting it does not wait for its imports."""
    for_this_process()


def warm_cluster(client: Any, gpus: bool = False) -> None:
    """Have every worker start its fork server now, without waiting, for a trainer whose
    ranks are forked (see :func:`enabled`): it calls this first thing, and by the time
    its ranks start the imports are done or under way."""
    if enabled(gpus):
        with contextlib.suppress(Exception):  # an optimisation: ranks start their own anyway
            client.run(warm, wait=False)


# ------------------------------------------------------------------------------ server
def serve(listen_fd: str, lifeline_fd: str, preload: str) -> None:
    """The server's main loop (:func:`dasktune.child_process.spawn`'s entry)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the worker's to handle
    listener = socket.socket(fileno=int(listen_fd))
    lifeline = int(lifeline_fd)
    for name in ["dasktune.train.rank", *json.loads(preload)]:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # torch is optional: ranks import what they need
            logger.debug("fork server: cannot preload %s: %s", name, exc)
        except Exception:  # noqa: BLE001 - a broken module must not stop the server
            logger.warning("fork server: importing %s failed; its ranks import it "
                           "themselves", name, exc_info=True)
    clients: dict[Connection, int | None] = {}  # connection -> the pid it started
    while True:
        ready = wait([listener, lifeline, *clients], timeout=_REAP_S)
        if lifeline in ready:  # the worker is gone: so are its ranks
            for pid in clients.values():
                if pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            os._exit(0)
        if listener in ready:
            with contextlib.suppress(OSError):
                clients[Connection(listener.accept()[0].detach())] = None
        for conn in [c for c in ready if isinstance(c, Connection)]:
            pid = clients[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("kill",)  # the launcher hung up: its rank goes too
                del clients[conn]
                conn.close()
            if msg[0] == "start" and pid is None:
                pid = _fork(msg, listener, lifeline, clients)
                clients[conn] = pid
                with contextlib.suppress(OSError):
                    conn.send(("pid", pid))
            elif msg[0] == "kill" and pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        _reap(clients)


def _reap(clients: dict[Connection, int | None]) -> None:
    """Tell each ended rank's connection its exit code, and close it."""
    by_pid = {pid: conn for conn, pid in clients.items() if pid is not None}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = by_pid.get(pid)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("exit", os.waitstatus_to_exitcode(status)))
            conn.close()
            del clients[conn]


def _fork(msg: tuple[Any, ...], listener: socket.socket, lifeline: int,
          clients: dict[Connection, int | None]) -> int:
    _, entry, args, env, cwd = msg
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    # The rank: none of the server's descriptors, its own environment, and death with
    # the server.
    code = 1
    try:
        listener.close()
        os.close(lifeline)
        for other in clients:
            other.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        child_process.die_with_parent(server)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        module, function = entry.split(":")
        getattr(importlib.import_module(module), function)(*args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the server
        traceback.print_exc()
    finally:
        child_process.exit_now(code)
