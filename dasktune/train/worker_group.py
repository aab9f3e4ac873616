"""One run of a trial's worker group: start a rank on each given worker, gather their
reports, and stop them all at once when one fails or its worker goes.

The controller (the trial's driver function) listens on one TCP port, authenticated
with a key of this run. On each worker a pinned Dask task (:mod:`dasktune.train.launcher`)
connects, rank 0's bringing a free port on its host for ``MASTER_PORT``; once all are
there each starts its rank's process (:mod:`dasktune.train.rank`), which connects too
and receives the loop and its :class:`~dasktune.train.context.RankInfo`.

Reports come in batches (see :mod:`dasktune.train.context`). When every rank has
reported index ``i``, ``on_report(i, metrics_of_rank_0,
staged_folder_or_None)`` commits and forwards (the controller's job) and its answer --
the committed checkpoint's path -- goes back to each rank that reported a checkpoint
(only such a rank waits for it). When every rank has made its ``k``-th
``get_preemption_info`` call, ``notice()`` answers them all alike.

Faults: a rank that raises, a rank's process that dies, a launcher whose connection
drops (its worker died) or a worker the gang seam reports lost ends the run with
:class:`GroupFailure` -- after every launcher was told to kill its rank's process by
PID and every connection closed (a rank blocked in a collective sees its controller go
and exits). Staged folders of the run are removed at its end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from distributed import Client, Future

from dasktune.layout import STAGED_PREFIX, staged_dir_name
from dasktune.train.context import PreemptionInfo, RankInfo
from dasktune.train.launcher import run_rank

__all__ = ["GroupFailure", "GroupSpec", "WorkerGroup"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0  # launchers and ranks must connect within this (tasks queue)
_KILL_WAIT_S = 10.0

#: ``on_report(index, rank0_metrics, staged)`` -> the committed checkpoint's path.
OnReport = Callable[[int, dict[str, Any], str | None], str | None]


class GroupFailure(RuntimeError):
    """The run ended early: a rank raised (``rank_error`` its traceback) or a rank's
    process or worker was lost (``lost`` the workers)."""

    def __init__(self, message: str, rank_error: str | None = None,
                 lost: list[str] | None = None):
        super().__init__(message)
        self.rank_error = rank_error
        self.lost = lost or []


@dataclass
class GroupSpec:
    """What every rank runs (the per-rank fields of ``info`` are filled per rank)."""

    loop: bytes  # cloudpickled train_loop_per_worker
    loop_config: dict[str, Any] | None
    info: RankInfo  # rank 0's; the others are copies with their own ranks
    listen_host: str
    cpus: float  # each rank's reserved CPUs: its math-library threads


class WorkerGroup:
    """Ranks on ``workers`` (``workers[i]`` runs rank ``i``) with ``devices[i]``."""

    def __init__(self, client: Client, workers: list[str], hosts: list[str],
                 devices: list[list[str]], spec: GroupSpec, on_report: OnReport,
                 lost: Callable[[], list[str]], interrupt: Callable[[], None] = lambda: None,
                 notice: Callable[[], PreemptionInfo | None] = lambda: None):
        if len(set(workers)) != len(workers):
            raise ValueError(f"a worker group needs a distinct worker per rank: {workers}")
        self.client = client
        self.workers, self.hosts, self.devices = workers, hosts, devices
        self.spec = spec
        self.on_report = on_report
        self.lost = lost  # workers of this group that left the cluster (the gang's news)
        self.interrupt = interrupt  # raises when the trial must stop now (checked often)
        self.notice = notice  # the preemption notice now (asked by get_preemption_info)
        self.n = len(workers)
        self.rank_pids: dict[int, int] = {}  # rank -> pid of its process
        self._launchers: dict[int, Connection] = {}
        self._ranks: dict[int, Connection] = {}
        self._futures: list[Future] = []

    # ------------------------------------------------------------------ running
    def run(self) -> None:
        """Run the group to its end; raises :class:`GroupFailure` (or what ``on_report``
        raised) after stopping every rank."""
        key = secrets.token_bytes(16)
        run = secrets.token_hex(4)
        listener = Listener((self.spec.listen_host, 0), authkey=key, backlog=2 * self.n + 4)
        incoming: list[tuple[str, int, Connection, tuple[Any, ...]]] = []
        arrived = threading.Condition()
        threading.Thread(target=_accept, args=(listener, incoming, arrived), daemon=True,
                         name="dasktune-train-accept").start()
        try:
            self._futures = [
                self.client.submit(run_rank, listener.address, key, rank, host,
                                   workers=[addr], allow_other_workers=False, pure=False,
                                   # Unique: a key two trials shared would run once.
                                   key=f"dasktune-rank-{self.spec.info.trial_id}-"
                                       f"{self.spec.info.group}-{rank}-{run}")
                for rank, (addr, host) in enumerate(zip(self.workers, self.hosts))]
            hellos = self._gather(incoming, arrived, "launcher")
            master_port = hellos[0][3]
            for rank, conn in self._launchers.items():
                conn.send(("start", self._env(rank, master_port), list(self.devices[rank]),
                           self.spec.cpus))
            self._gather(incoming, arrived, "rank")
            for rank, conn in self._ranks.items():
                info = replace(self.spec.info, **self._ranks_of(rank))
                conn.send((info, self.spec.loop, self.spec.loop_config))
            self._loop()
        finally:
            self.stop()
            listener.close()

    def _gather(self, incoming: list[Any], arrived: threading.Condition,
                kind: str) -> dict[int, tuple[Any, ...]]:
        """Wait until every rank's ``kind`` connection arrived (a launcher's task failing,
        or a worker lost, ends the wait)."""
        got: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + _START_TIMEOUT_S
        while len(got) < self.n:
            with arrived:
                arrived.wait_for(lambda: bool(incoming), timeout=0.2)
                batch, incoming[:] = list(incoming), []
            for what, rank, conn, hello in batch:
                (self._launchers if what == "launcher" else self._ranks)[rank] = conn
                if what == kind:
                    got[rank] = hello
                if what == "rank":
                    self.rank_pids[rank] = hello[2]
            self._check_health()
            self.interrupt()
            if time.monotonic() > deadline:
                raise GroupFailure(f"the worker group did not start within "
                                   f"{_START_TIMEOUT_S:.0f}s ({len(got)} of {self.n} {kind}s "
                                   f"connected; workers {self.workers})")
        return got

    def _env(self, rank: int, master_port: int) -> dict[str, str]:
        ranks = self._ranks_of(rank)
        return {"RANK": str(rank), "WORLD_SIZE": str(self.n),
                "LOCAL_RANK": str(ranks["local_rank"]),
                "LOCAL_WORLD_SIZE": str(ranks["local_world_size"]),
                "NODE_RANK": str(ranks["node_rank"]),
                "MASTER_ADDR": self.hosts[0], "MASTER_PORT": str(master_port)}

    def _ranks_of(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s place: its rank among the ranks on its host, and its host's
        rank among the group's hosts (in order of their lowest rank)."""
        hosts = list(dict.fromkeys(self.hosts))
        host = self.hosts[rank]
        on_host = [r for r, h in enumerate(self.hosts) if h == host]
        return {"world_rank": rank, "world_size": self.n,
                "local_rank": on_host.index(rank), "local_world_size": len(on_host),
                "node_rank": hosts.index(host)}

    def _loop(self) -> None:
        """Gather reports until every rank said done."""
        pending: dict[int, dict[int, tuple[dict[str, Any], bool]]] = {}
        asks: dict[int, set[int]] = {}  # get_preemption_info call -> ranks that made it
        done: set[int] = set()
        reached: dict[int, int] = {}  # rank -> the last index it reported
        flushed = -1  # the ranks were asked to send their reports up to this index
        conns = {conn: ("rank", r) for r, conn in self._ranks.items()}
        conns.update({conn: ("launcher", r) for r, conn in self._launchers.items()})
        while len(done) < self.n:
            self.interrupt()
            # A rank's own messages first: its launcher's news that the process exited
            # may arrive in the same wait as the rank's "done".
            for conn in sorted(wait(list(conns), timeout=0.2),
                               key=lambda c: conns[c][0] != "rank"):
                what, rank = conns[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    if rank in done:
                        # Its loop ended: its process exits, then its launcher task
                        # returns, while slower ranks may still be running theirs.
                        del conns[conn]
                        continue
                    self._check_health()
                    raise GroupFailure(f"rank {rank}'s {'process' if what == 'rank' else 'worker'}"
                                       f" ({self.workers[rank]}) was lost",
                                       lost=[self.workers[rank]]) from None
                if msg[0] == "report":
                    for index, metrics, has_checkpoint in msg[1]:
                        reached[rank] = max(index, reached.get(rank, -1))
                        pending.setdefault(index, {})[rank] = (metrics, has_checkpoint)
                        if has_checkpoint and index > flushed:
                            # The barrier waits for the others' batched reports.
                            flushed = index
                            self._ask_flush(index, reached, done)
                        if len(pending[index]) == self.n:
                            self._commit(index, pending.pop(index))
                elif msg[0] == "notice?":
                    asks.setdefault(msg[1], set()).add(rank)
                    if len(asks[msg[1]]) == self.n:
                        del asks[msg[1]]
                        info = self.notice()
                        for conn_ in self._ranks.values():
                            with contextlib.suppress(OSError):
                                conn_.send(("notice", msg[1], info))
                elif msg[0] == "done":
                    if msg[1] is not None:
                        raise GroupFailure(f"rank {rank} raised:\n{msg[1]}", rank_error=msg[1])
                    done.add(rank)
                if any(done - got for got in asks.values()):
                    raise GroupFailure(
                        "a rank ended without a train.get_preemption_info call that other "
                        "ranks made: every rank must call it the same number of times",
                        rank_error="get_preemption_info called a different number of times")
                unmatched = [i for i, got in pending.items() if done - set(got)]
                if unmatched:  # a rank ended without a report the others made
                    raise GroupFailure(
                        f"rank(s) {sorted(done - set(pending[unmatched[0]]))} ended without "
                        f"report #{unmatched[0]} that other ranks made: every rank must call "
                        "train.report the same number of times",
                        rank_error="train.report called a different number of times")
                elif msg[0] == "exit" and rank not in done:
                    raise GroupFailure(f"rank {rank}'s process on {self.workers[rank]} exited "
                                       f"with code {msg[2]} before the loop ended",
                                       lost=[self.workers[rank]])
            self._check_health()

    def _ask_flush(self, index: int, reached: dict[int, int], done: set[int]) -> None:
        """Ask each rank not yet at ``index`` to send its batched reports through it."""
        for rank, conn in self._ranks.items():
            if rank not in done and reached.get(rank, -1) < index:
                with contextlib.suppress(OSError):
                    conn.send(("flush", index))

    def _commit(self, index: int, reports: dict[int, tuple[dict[str, Any], bool]]) -> None:
        staged = None
        if any(has for _, has in reports.values()):
            staged = posixpath.join(self.spec.info.trial_path,
                                    staged_dir_name(self.spec.info.group, index))
        path = self.on_report(index, reports[0][0], staged)
        for rank, (_, has_checkpoint) in reports.items():
            if has_checkpoint:  # only a rank that gave a checkpoint waits for the answer
                # A rank whose loop ended does not wait for the answer to its last reports.
                with contextlib.suppress(OSError):
                    self._ranks[rank].send(("ack", index, path))

    def _check_health(self) -> None:
        gone = [w for w in self.lost() if w in self.workers]
        if gone:
            raise GroupFailure(f"worker(s) {gone} of the group left the cluster", lost=gone)
        for rank, fut in enumerate(self._futures):
            if fut.status in ("error", "cancelled"):
                raise GroupFailure(f"rank {rank}'s launcher on {self.workers[rank]} "
                                   f"failed: {fut.exception() if fut.status == 'error' else 'cancelled'}",
                                   lost=[self.workers[rank]])

    # ------------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Kill every rank's process (by its launcher, by PID on its worker), wait briefly
        until each launcher has hung up, close every connection, cancel the launchers'
        tasks, drop the run's staged folders."""
        for conn in self._launchers.values():
            with contextlib.suppress(OSError):
                conn.send(("kill",))
        for conn in self._ranks.values():
            conn.close()
        self._await_launchers()
        for conn in self._launchers.values():
            conn.close()
        if self._futures:
            self.client.cancel(self._futures)
        self._drop_staged()

    def _await_launchers(self) -> None:
        """Wait up to ``_KILL_WAIT_S`` for every launcher to hang up, which it does once
        its rank's process is dead. Its connection, not its task's state: a closing
        worker (one that retires) never reports the end of its tasks."""
        live = [c for c in self._launchers.values() if not c.closed]
        deadline = time.monotonic() + _KILL_WAIT_S
        while live and time.monotonic() < deadline:
            for conn in wait(live, timeout=max(0.0, deadline - time.monotonic())):
                try:
                    conn.recv()  # a last "exit" note, then the end
                except (EOFError, OSError):
                    live.remove(conn)  # type: ignore[arg-type]

    def _drop_staged(self) -> None:
        info = self.spec.info
        storage, prefix = info.storage, f"{STAGED_PREFIX}{info.group}_"
        try:
            if storage.is_local:
                names = os.listdir(info.trial_path) if os.path.isdir(info.trial_path) else []
            else:
                names = [posixpath.basename(p) for p in storage.fs.ls(info.trial_path, detail=False)]
            for name in names:
                if name.startswith(prefix):
                    storage.delete(posixpath.join(info.trial_path, name))
        except Exception:  # noqa: BLE001 - leftovers are hidden and never restored
            logger.debug("could not remove staged folders of %s", info.group, exc_info=True)


def _accept(listener: Listener, incoming: list[Any], arrived: threading.Condition) -> None:
    """Take connections until the listener closes; each says who it is first."""
    while True:
        try:
            conn = listener.accept()
        except (OSError, EOFError):
            return
        except Exception:  # noqa: BLE001 - a stranger that failed authentication
            continue
        try:
            hello = conn.recv()
        except (EOFError, OSError):
            continue
        with arrived:
            incoming.append((hello[0], hello[1], conn, hello))
            arrived.notify_all()
