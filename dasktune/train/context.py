"""``train.report``, ``train.get_checkpoint``, ``train.get_context`` inside a training rank.

Each rank of a multi-worker trial is a process of its own (:mod:`dasktune.train.rank`)
holding one :class:`RankSession`: who it is (rank, world size, local and node rank),
where the trial's files go, and the connection to the trial's controller.

``report`` with a checkpoint is a barrier across the ranks, as Ray's is: a rank
uploads its files into the report's staged folder in the trial's storage, tells the
controller and waits; once all ranks have reported that index the controller commits
the staged folder once and answers each rank with the committed checkpoint, and
``report`` returns. A report without a checkpoint does not wait: it joins the rank's
batch, which a thread sends ``RankInfo.report_interval_s`` after its first report (the
controller takes the reports in order). A batch per step would wake the controller's
worker twice a step, and on a busy host each wake-up delays a rank's collective. A
checkpoint report sends the batch ahead of it, and the controller asks the other ranks
to send theirs at once (``flush``) when they are what the barrier waits for.
``get_preemption_info`` is a barrier too, so every rank gets the same notice for the
same call.
"""

from __future__ import annotations

import posixpath
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune.checkpoint import Checkpoint
from dasktune.layout import staged_dir_name

if TYPE_CHECKING:
    from dasktune.storage import ExperimentStorage

__all__ = ["PreemptionInfo", "RankInfo", "RankSession", "TrainContext", "get_checkpoint",
           "get_context", "get_preemption_info", "report"]


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption of the trial's workers (Ray's ``train.PreemptionInfo``).

    ``preempted_node_to_ranks`` maps each retiring worker to the ranks it hosts;
    ``deadline_ms`` is the reclaim time (UNIX ms) when known.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]] = field(default_factory=dict)

    @property
    def preempted_node_ids(self) -> list[str]:
        """The retiring workers, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """The ranks on retiring workers, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


@dataclass
class RankInfo:
    """Everything one rank needs from its controller (pickled to the rank's process)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    trial_id: str
    trial_name: str
    experiment_name: str
    storage: ExperimentStorage
    trial_path: str
    group: str  # names this run of the worker group (its staged folders)
    checkpoint_path: str | None
    use_gpu: bool
    backend: str
    timeout_s: float
    report_interval_s: float  # how long a report without checkpoint may wait (0: none)


class RankSession:
    """One rank's view of its trial; reports travel over ``conn`` to the controller, as
    ``("report", [(index, metrics, has_checkpoint), ...])`` batches in index order."""

    def __init__(self, info: RankInfo, conn: Any):
        self.info = info
        self._conn = conn
        self.acks: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._next = 0
        self._waiting: int | None = None  # the checkpoint report waiting for its commit
        self.notices: queue.Queue[tuple[int, PreemptionInfo | None]] = queue.Queue()
        self._asks = 0  # get_preemption_info calls so far
        self.checkpoint: Checkpoint | None = (
            Checkpoint(info.checkpoint_path, info.storage.fs) if info.checkpoint_path else None)
        # The batch and every send share one lock, so messages leave in order.
        self._lock = threading.Condition()
        self._batch: list[tuple[int, dict[str, Any] | None, bool]] = []
        self._batch_since = 0.0
        self._urgent = -1  # a barrier waits for this rank's reports up to this index
        self._sender: threading.Thread | None = None

    def send(self, message: tuple[Any, ...]) -> None:
        """A message to the controller, after the reports batched so far (user threads
        may report, so sends come from several threads)."""
        with self._lock:
            self._send_batch()
            self._conn.send(message)

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
        """As :func:`report`, for this rank."""
        if not isinstance(metrics, dict):
            raise TypeError(f"train.report: metrics must be a dict, got "
                            f"{type(metrics).__name__}")
        with self._lock:  # user threads may report too
            index, self._next = self._next, self._next + 1
        if checkpoint is None:
            # No wait: a rank waits only where it must, for a checkpoint to be committed
            # (a round trip through the controller every step would cost more than a
            # small model's step). Only rank 0's metrics become results: the others say
            # how far they are, nothing more.
            self._add((index, metrics if self.info.world_rank == 0 else None, False))
            return
        staged = posixpath.join(self.info.trial_path, staged_dir_name(self.info.group, index))
        with checkpoint.as_directory() as local:
            self.info.storage.stage_files(local, staged)
        self._waiting = index
        self._add((index, metrics, True), now=True)
        acked, path = self.acks.get()  # once every rank reported it and it is committed
        if acked != index:
            raise RuntimeError(f"train.report: rank {self.info.world_rank} reported #{index} "
                               f"but the group committed #{acked}: every rank must call "
                               "train.report the same number of times")
        if path:
            self.checkpoint = Checkpoint(path, self.info.storage.fs)

    def send_through(self, index: int) -> None:
        """The controller's barrier at ``index`` waits for this rank: send the batch now,
        and each report up to ``index`` as it comes (the watcher thread calls it)."""
        with self._lock:
            self._urgent = max(self._urgent, index)
            self._send_batch()

    def _add(self, item: tuple[int, dict[str, Any] | None, bool], now: bool = False) -> None:
        with self._lock:
            self._batch.append(item)
            if now or item[0] <= self._urgent or self.info.report_interval_s <= 0:
                self._send_batch()
            elif len(self._batch) == 1:
                self._batch_since = time.monotonic()
                if self._sender is None:
                    self._sender = threading.Thread(target=self._send_batches, daemon=True,
                                                    name="dasktune-train-reports")
                    self._sender.start()
                self._lock.notify()

    def _send_batch(self) -> None:
        """Send the batch (the lock held)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._conn.send(("report", batch))

    def _send_batches(self) -> None:
        """The sender thread: each batch ``report_interval_s`` after its first report."""
        with self._lock:
            while True:
                self._lock.wait_for(lambda: bool(self._batch))
                while self._batch:
                    left = self._batch_since + self.info.report_interval_s - time.monotonic()
                    if left <= 0:
                        try:
                            self._send_batch()
                        except OSError:
                            return  # the controller is gone: the watcher ends the process
                    else:
                        self._lock.wait(left)

    def on_ack(self, index: int, path: str | None) -> None:
        """The controller handled report ``index`` of every rank (the watcher thread
        calls it): a report waiting for that commit returns."""
        if index == self._waiting:
            self._waiting = None
            self.acks.put((index, path))

    def preemption_info(self) -> PreemptionInfo | None:
        """As :func:`get_preemption_info`: one answer for all ranks (a barrier)."""
        ask, self._asks = self._asks, self._asks + 1
        self.send(("notice?", ask))
        answered, info = self.notices.get()
        if answered != ask:
            raise RuntimeError("train.get_preemption_info: every rank must call it the same "
                               "number of times")
        return info


_rank: RankSession | None = None


def bind(session: RankSession | None) -> None:
    """Make ``session`` this process's rank (the rank process calls it once)."""
    global _rank
    _rank = session


def _session(what: str) -> RankSession:
    if _rank is None:
        raise RuntimeError(f"train.{what}() was called outside of a training worker "
                           "(a TorchTrainer's train_loop_per_worker); inside a Tune "
                           "trial use tune.report / tune.get_checkpoint")
    return _rank


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None,
           checkpoint_dir_name: str | None = None, **kwargs: Any) -> None:
    """Report metrics (and optionally a checkpoint) from every rank.

    Every rank must call it the same number of times. With a checkpoint it returns once
    all ranks have reported this index and the checkpoint (the files of every rank that
    gave one, merged into one folder) is committed; without one it does not wait.
    Rank 0's metrics are the trial's result.
    ``checkpoint_dir_name`` and Ray's upload options are accepted and ignored:
    checkpoints keep dasktune's ``checkpoint_NNNNNN`` names.
    """
    del checkpoint_dir_name, kwargs
    _session("report").report(metrics, checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The newest committed checkpoint of this trial (after a restart: the one the group
    restarted from), or None."""
    return _session("get_checkpoint").checkpoint


def get_preemption_info() -> PreemptionInfo | None:
    """A preemption notice, or None: a worker of the trial is retiring, so checkpoint now
    (the group restarts from it elsewhere). As in Ray, every rank must call it the same
    number of times: it is a barrier, so all ranks get the same answer for the same call."""
    return _session("get_preemption_info").preemption_info()


class TrainContext:
    """What a rank knows about itself (Ray's ``ray.train.TrainContext``)."""

    def __init__(self, session: RankSession):
        self._info = session.info
        self._session = session

    def get_world_rank(self) -> int:
        """This rank (0 .. world size - 1)."""
        return self._info.world_rank

    def get_world_size(self) -> int:
        """How many ranks the trial runs."""
        return self._info.world_size

    def get_local_rank(self) -> int:
        """This rank's index among the ranks on its host."""
        return self._info.local_rank

    def get_local_world_size(self) -> int:
        """How many of the trial's ranks run on this host."""
        return self._info.local_world_size

    def get_node_rank(self) -> int:
        """This host's index among the trial's hosts (in order of their lowest rank)."""
        return self._info.node_rank

    def get_trial_id(self) -> str:
        """The Tune trial's id."""
        return self._info.trial_id

    def get_trial_name(self) -> str:
        """The Tune trial's name."""
        return self._info.trial_name

    def get_experiment_name(self) -> str:
        """The experiment's name."""
        return self._info.experiment_name

    def get_storage(self) -> ExperimentStorage:
        """The experiment's storage (where checkpoints go)."""
        return self._info.storage

    def get_trial_dir(self) -> str:
        """The trial's folder in storage."""
        return self._info.trial_path

    def get_preemption_info(self) -> PreemptionInfo | None:
        """As :func:`get_preemption_info`."""
        return self._session.preemption_info()


def get_context() -> TrainContext:
    """This rank's context (raises outside a training worker)."""
    return TrainContext(_session("get_context"))
