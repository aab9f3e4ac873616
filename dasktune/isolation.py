"""Per-trial device isolation: run a trial's code in a process of its own.

``CUDA_VISIBLE_DEVICES`` is read once per process, when CUDA initialises, so two GPU
trials sharing a worker process cannot see different devices. A trial that was given
GPUs (or any trial, with the ``dasktune.executor.isolate`` setting) therefore runs in a
child process whose environment names exactly its devices before anything imports
CUDA. CPU-only trials keep running in a thread of the worker (no start-up cost).

The child is a fresh interpreter (``subprocess``, not ``multiprocessing``: Dask's nanny
workers are daemonic processes, which ``multiprocessing`` forbids to have children). It
runs the attempt through the same :class:`~dasktune.attempt.Attempt` as the in-thread
path -- ``tune.report``, ``tune.get_checkpoint``, ``tune.get_context``, checkpoints
committed to storage straight from the child -- and talks to the parent over one socket
pair:

* child -> parent: ``("report", result, checkpoint_path)`` per report, relayed to the
  attempt's ``emit`` (the actor's bounded buffer: the back-pressure), then
  ``("done", error)``;
* parent -> child: ``("stop", after_checkpoint)`` when the actor is asked to stop,
  ``("fence",)`` when it was fenced (stop, and commit no further checkpoint);
* both ways: ``("gang", ...)``, the trial's gang requests up and the driver's answers
  down (:mod:`dasktune.gang_desk` relays them).

Dask inside the trial: the child connects a client to the worker's scheduler (with the
worker's security) and makes it the process's default, so ``distributed.get_client()``
and ``dask.compute`` reach the cluster as they do in an in-thread trial. The child is no
Dask worker: ``distributed.get_worker()`` and ``worker_client()`` raise there.

The child never outlives its trial: it exits when the socket closes (the worker went
away) and, on Linux, is also killed by the kernel when the thread that started it dies
(``PR_SET_PDEATHSIG``). A child that dies without saying ``done`` errors the trial with
its exit code; one that ignores a stop for :data:`STOP_GRACE_S` is terminated.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import subprocess
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import cloudpickle
from distributed import Client

from dasktune import _dask_config
from dasktune.attempt import Attempt
from dasktune.child_process import (
    ORPHAN_EXIT,
    child_env,
    describe_exit,
    die_with_parent,
    exit_now,
    reap,
    spawn,
)
from dasktune.resources import parse_visible_devices
from dasktune.shipping import dumps_trainable

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["STOP_GRACE_S", "TrialProcessError", "child_devices", "run_in_process",
           "wants_process"]

#: Seconds a child may run on after a stop-now request before it is terminated.
STOP_GRACE_S = 5.0
_DONE_GRACE_S = 10.0  # a child that said "done" but does not exit is killed after this
_POLL_S = 0.1

# The worker's own device list, read before any in-thread trial overwrites the
# process-wide CUDA_VISIBLE_DEVICES (the actor module imports this one).
_WORKER_VISIBLE = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))


class TrialProcessError(RuntimeError):
    """A trial's child process raised (the message is its traceback) or died."""


def wants_process(spec: TrialSpec) -> bool:
    """Whether ``spec``'s attempt runs in a child process (it has GPUs, or isolate is on)."""
    if spec.gpu_ids or float(spec.resources.get("GPU", 0.0) or 0.0) > 0:
        return True
    return bool(spec.isolate or _dask_config.get("executor.isolate"))


def child_devices(gpu_ids: list[str], worker_visible: list[str] | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` tokens for a trial given ``gpu_ids`` on this worker.

    The executor hands out ordinals ``"0"``, ``"1"``, ... into the worker's devices; when
    the worker process itself was limited to some devices (the embedded cluster splits
    GPUs across workers this way), ordinal ``i`` is the worker's ``i``-th visible device.
    Tokens that are not such ordinals (UUIDs) pass through unchanged.
    """
    visible = _WORKER_VISIBLE if worker_visible is None else worker_visible
    out = []
    for token in gpu_ids:
        token = str(token)
        if visible and token.isdigit() and int(token) < len(visible):
            out.append(visible[int(token)])
        else:
            out.append(token)
    return out


# ---------------------------------------------------------------------------------- parent
def run_in_process(attempt: Attempt, worker_address: str,
                   cluster: tuple[str, Any] | None = None) -> None:
    """Run ``attempt`` in a child process; return when it ended.

    ``cluster`` (the worker's scheduler address and its ``distributed.Security``) is
    the cluster the child's default client connects to (see the module docs).

    Reports go to ``attempt.emit``; its stop flags are relayed to the child.
    Returns normally when the trial finished or was stopped.

    Raises:
        TrialProcessError: the trial raised in the child (message: its traceback), or the
            child died (message: its exit code or signal).
    """
    spec = copy.copy(attempt.spec)
    devices = child_devices(list(spec.gpu_ids))
    spec.gpu_ids = devices
    spec.trainable = dumps_trainable(attempt.spec.trainable)
    payload = cloudpickle.dumps((spec, attempt.params, worker_address, cluster))

    mine, theirs = socket.socketpair()
    try:
        proc = spawn("dasktune.isolation:_child_main",
                     [str(theirs.fileno()), str(os.getpid())],
                     child_env(devices, cpus=float(spec.resources.get("CPU", 1.0))),
                     pass_fds=(theirs.fileno(),))
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    conn = Connection(mine.detach())
    done, error, stopped = False, None, False
    try:
        conn.send_bytes(payload)
        done, error, stopped = _relay(attempt, conn, proc)
    except (EOFError, OSError):  # the child closed its end: it is exiting or dead
        stopped = attempt.stop_now.is_set()
    finally:
        conn.close()
        # Closing the socket ends a child that ignored a stop (its watchdog sees EOF);
        # reap escalates to SIGTERM/SIGKILL if even that does not end it.
        code = reap(proc, _DONE_GRACE_S)
    if error:
        raise TrialProcessError(f"the trial raised in its process (pid {proc.pid}):\n{error}")
    if not done and not stopped:
        raise TrialProcessError(f"the trial's process (pid {proc.pid}) {describe_exit(code)}")


def _relay(attempt: Attempt, conn: Connection,
           proc: subprocess.Popen[bytes]) -> tuple[bool, str | None, bool]:
    """Pump reports up and stop requests down; (said done, its error, stopped by us)."""
    sent_now = sent_ckpt = False
    kill_at: float | None = None
    while True:
        answers = attempt.gangs.take_answers() if attempt.gangs is not None else []
        if answers:  # the driver's answers to the child's gang requests
            conn.send_bytes(cloudpickle.dumps(("gang", answers)))
        if not sent_ckpt and attempt.stop_after_checkpoint.is_set():
            conn.send_bytes(pickle.dumps(("stop", True)))
            sent_ckpt = True
        if attempt.checkpoint_now.is_set():
            attempt.checkpoint_now.clear()
            conn.send_bytes(pickle.dumps(("checkpoint",)))
        if not sent_now and attempt.stop_now.is_set():
            # A fenced attempt (no driver will collect it) must also commit nothing more.
            conn.send_bytes(pickle.dumps(("fence",) if attempt.fenced.is_set()
                                         else ("stop", False)))
            sent_now = True
            kill_at = time.monotonic() + STOP_GRACE_S
        if kill_at is not None and time.monotonic() > kill_at:
            return False, None, True  # ignored the stop: reap terminates it
        if not conn.poll(_POLL_S):
            if proc.poll() is not None and not conn.poll(0):
                return False, None, sent_now
            continue
        try:
            msg = pickle.loads(conn.recv_bytes())
        except EOFError:
            return False, None, sent_now
        if msg[0] == "report":
            attempt.emit(msg[1], msg[2])
        elif msg[0] == "gang" and attempt.gangs is not None:
            attempt.gangs.relay_notes(msg[1])
        elif msg[0] == "done":
            return True, msg[1], sent_now


# ----------------------------------------------------------------------------------- child
def _watch_parent(conn: Connection, attempt: Attempt) -> None:
    """Apply the parent's stop requests; exit at once when the parent goes away."""
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(ORPHAN_EXIT)
        if msg[0] == "checkpoint":
            attempt.checkpoint_now.set()
        elif msg[0] == "stop":
            attempt.request_stop(after_checkpoint=msg[1])
        elif msg[0] == "fence":
            attempt.fence("fenced by the worker")
        elif msg[0] == "gang" and attempt.gangs is not None:
            attempt.gangs.apply_answers(msg[1])


def _child_main(fd: str, parent_pid: str) -> None:
    """Entry point of the trial process: run the attempt, relay to the parent, exit."""
    die_with_parent(int(parent_pid))
    conn = Connection(int(fd))
    spec, params, worker_address, cluster = cloudpickle.loads(conn.recv_bytes())
    spec.trainable = cloudpickle.loads(spec.trainable)
    send_lock = threading.Lock()  # user threads may report too

    def emit(result: dict[str, Any] | None, path: str | None) -> None:
        data = cloudpickle.dumps(("report", result, path))
        with send_lock:
            conn.send_bytes(data)

    def send_gang_notes() -> None:  # the trial's gang requests, for the actor to relay
        notes = attempt.gangs.take_notes() if attempt.gangs is not None else []
        if notes:
            data = cloudpickle.dumps(("gang", notes))
            with send_lock:
                conn.send_bytes(data)

    attempt = Attempt(spec, params, emit, wake=send_gang_notes)
    threading.Thread(target=_watch_parent, args=(conn, attempt), daemon=True,
                     name="dasktune-parent-watch").start()
    try:
        if cluster is not None:
            address, security = cluster
            # The process's default client, as the worker's is for an in-thread trial;
            # it goes with the process (os._exit below).
            Client(address, security=security, set_as_default=True,
                   name=f"dasktune-trial-{spec.trial_id}")
        error, _ = attempt.run(worker_address)
    except BaseException:  # noqa: BLE001 - no client: the trial's error, for the driver
        error = traceback.format_exc()
    try:
        with send_lock:
            conn.send_bytes(pickle.dumps(("done", error)))
    except OSError:
        pass
    exit_now()
