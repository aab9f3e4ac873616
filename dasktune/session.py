"""``tune.report``, ``tune.get_checkpoint``, ``tune.get_context`` inside a running trial.

Also the trial's gang reservations (:func:`reserve_workers`, :func:`release_workers`,
:func:`gang_lost`, :func:`wait_gang_lost`, :func:`gang_retiring`): several worker
processes for one trial, all or none, granted by the driver (the desk between the trial
and its actor is :mod:`dasktune.gang_desk`; what they promise, for ``dasktune.train`` and
any trainer, is in ``docs/guides/multi-worker-trials.md``): a lost gang worker does not lose the trial -- the gang's slots are given
back and :func:`gang_lost` names the dead workers, for the trainer to restart its group
on a fresh gang; a retiring one is named by :func:`gang_retiring` while its retirement
waits for the gang's release; the trial is lost (and its gangs released) when its own
worker dies.

Over ~400 lines because every call a trial's code makes lives here, one home for what
``tune`` and ``dasktune.train`` hand the user (the desk behind the gang calls is not).

Each running trial has one :class:`TrialSession`, bound to the thread that runs the
user's code. A report fills Ray's auto fields, commits its checkpoint to storage
(``report`` returns only once it is committed), applies the ``stop`` dict locally so
a trial stops exactly where the criterion says, and hands the result to the trial
actor's buffer, which the driver drains in batches.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune import scratch
from dasktune.checkpoint import Checkpoint
from dasktune.execution.protocol import WorkerGang
from dasktune.gang_desk import GangStopped
from dasktune.layout import checkpoint_index
from dasktune.result import fill_auto_fields, format_date, reported_keys
from dasktune.storage import CommitFenced

if TYPE_CHECKING:
    from dasktune.gang_desk import GangDesk
    from dasktune.storage import ExperimentStorage

logger = logging.getLogger(__name__)
_local = threading.local()
_sessions: dict[int, TrialSession] = {}
_sessions_lock = threading.Lock()


class StopTrial(BaseException):
    """Raised inside ``tune.report`` to end a trial the driver (or its stop dict) stopped.

    A ``BaseException`` so that a user's ``except Exception`` does not swallow it.
    """


@dataclass
class TrialSpec:
    """Everything a trial attempt needs on its worker; built by the executor, pickled once."""

    trial_id: str
    trial_name: str
    experiment_name: str
    config: dict[str, Any]
    trainable: Any
    storage: ExperimentStorage
    trial_path: str
    attempt: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)
    restore_path: str | None = None
    restore_meta: dict[str, Any] = field(default_factory=dict)
    stop: dict[str, Any] | None = None
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool = False
    next_checkpoint_index: int = 0
    param_keys: dict[str, str] = field(default_factory=dict)
    experiment_tag: str = ""
    max_buffered: int = 10000
    sync_reports: bool = False
    # Run the user's code in a child process (always for GPU trials); set from the
    # driver's dasktune.executor.isolate so the driver's setting is what counts.
    isolate: bool = False
    # A class trainable's instance stays in the actor for the next trial, which gets it
    # through reset_config (TuneConfig.reuse_actors).
    reuse_instance: bool = False
    # Workers the driver reserved with the attempt (it learnt the experiment's gang
    # shape): the first reserve_workers() asking for that shape gets them at once.
    gang: WorkerGang | None = None


class TrialSession:
    """The state of one trial attempt as seen from the user's code."""

    def __init__(self, spec: TrialSpec, emit: Callable[[dict[str, Any], str | None], None],
                 should_stop: Callable[..., bool], worker_address: str = "",
                 fenced: Callable[[], bool] | None = None, gangs: GangDesk | None = None):
        self.spec = spec
        self._gangs = gangs  # None where no actor relays gang requests
        self._emit = emit
        self._should_stop = should_stop
        self._fenced = fenced  # whether no driver will ever collect this attempt
        meta = spec.restore_meta or {}
        self.iteration = int(meta.get("training_iteration", 0))
        self.time_total = float(meta.get("time_total_s", 0.0))
        self.iterations_since_restore = 0
        self.time_since_restore = 0.0
        self.checkpoint_index = spec.next_checkpoint_index
        self.latest_checkpoint: Checkpoint | None = (
            Checkpoint(spec.restore_path, spec.storage.fs) if spec.restore_path else None
        )
        self._start = time.time()
        self._last = time.monotonic()
        self.hostname = socket.gethostname()
        self.node_ip = node_ip(worker_address)
        self.worker_address = worker_address
        self.pid = os.getpid()
        self.local_dir: str | None = None
        self._date_second = -1
        self._date_text = ""
        self._at_end: list[Callable[[bool], None]] = []
        self.last_result: dict[str, Any] | None = None  # the newest report's result

    # ------------------------------------------------------------ results
    def fill_auto_fields(self, metrics: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        this_iter = now - self._last
        self._last = now
        self.iteration += 1
        self.iterations_since_restore += 1
        self.time_total += this_iter
        self.time_since_restore += this_iter
        wall = time.time()
        return fill_auto_fields(
            metrics,
            training_iteration=self.iteration,
            iterations_since_restore=self.iterations_since_restore,
            time_this_iter_s=this_iter,
            time_total_s=self.time_total,
            time_since_restore=self.time_since_restore,
            timestamp=wall,
            date=self._date(int(wall)),
            trial_id=self.spec.trial_id,
            experiment_tag=self.spec.experiment_tag,
            pid=self.pid,
            hostname=self.hostname,
            node_ip=self.node_ip,
            worker=self.worker_address,
            config=self.spec.config,
        )

    def _date(self, second: int) -> str:
        """Ray's ``date`` field, formatted once per second (results come faster)."""
        if second != self._date_second:
            self._date_second = second
            self._date_text = format_date(second)
        return self._date_text

    def commit_checkpoint(self, checkpoint: Checkpoint, result: dict[str, Any]) -> str:
        """Upload a checkpoint into the trial's folder and commit it (manifest last)."""
        spec = self.spec
        with checkpoint.as_directory() as local:
            try:
                path = spec.storage.commit_checkpoint(local, spec.trial_path,
                                                      self.checkpoint_index,
                                                      self._checkpoint_meta(result),
                                                      fenced=self._fenced)
            except CommitFenced:
                raise StopTrial() from None
        return self._committed(path)

    def commit_staged(self, staged: str, result: dict[str, Any]) -> str:
        """Commit the folder ``staged`` in the experiment's storage (filled by the ranks
        of a multi-worker trial) as the trial's next checkpoint, with the same manifest,
        naming and fencing as :meth:`commit_checkpoint`."""
        spec = self.spec
        try:
            path = spec.storage.commit_staged(staged, spec.trial_path, self.checkpoint_index,
                                              self._checkpoint_meta(result),
                                              fenced=self._fenced)
        except CommitFenced:
            raise StopTrial() from None
        return self._committed(path)

    def _checkpoint_meta(self, result: dict[str, Any]) -> dict[str, Any]:
        return {
            "trial_id": self.spec.trial_id,
            "attempt": self.spec.attempt,
            "training_iteration": result.get("training_iteration", self.iteration),
            "time_total_s": result.get("time_total_s", self.time_total),
            # The result this checkpoint was reported with: a driver that never received
            # the report (its worker died) can still log it when it resumes from here.
            "result": {k: v for k, v in result.items() if k != "config"},
        }

    def _committed(self, path: str) -> str:
        index = checkpoint_index(path)
        self.checkpoint_index = self.checkpoint_index if index is None else index + 1
        self.latest_checkpoint = Checkpoint(path, self.spec.storage.fs)
        return path

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None,
               staged: str | None = None) -> None:
        """One result of the trial; with ``checkpoint`` (a local one) or ``staged`` (a
        folder in storage, see :meth:`commit_staged`), committed first."""
        if not isinstance(metrics, dict):
            raise TypeError(f"tune.report: metrics must be a dict, got {type(metrics).__name__}")
        if self._should_stop():
            raise StopTrial()
        result = self.fill_auto_fields(metrics)
        path = None
        if checkpoint is not None:
            path = self.commit_checkpoint(checkpoint, result)
        elif staged is not None:
            path = self.commit_staged(staged, result)
        if path is not None:
            result["checkpoint_dir_name"] = path.rsplit("/", 1)[-1]
        hit = stop_dict_hit(self.spec.stop, result)
        if hit:
            result["done"] = True
        self.last_result = result
        self._emit(result, path)
        if hit or self._should_stop(path is not None):
            raise StopTrial()

    def must_stop(self) -> bool:
        """Whether the driver asked this attempt to stop now (or fenced it)."""
        return self._should_stop()

    def stop_pending(self) -> bool:
        """Whether the driver asked this attempt to stop (now, or after its next
        checkpoint: a worker retiring), for code that runs the trial's work elsewhere."""
        return self._should_stop(True)

    @property
    def done(self) -> bool:
        """Whether the newest result says the trial is done (its ``done`` key, or the
        stop dict hit)."""
        return bool(self.last_result and self.last_result.get("done"))

    def record_end(self) -> None:
        """Write the trial-end marker (the trainable returned; its final result) to
        storage, unless this attempt was fenced: a restore then counts the trial as
        TERMINATED even if no driver recorded its end."""
        if self._fenced is not None and self._fenced():
            return
        self.spec.storage.write_trial_end(
            self.spec.trial_path, trial_id=self.spec.trial_id, attempt=self.spec.attempt,
            result=self.last_result or {},
            ended_by="trainable",
            reason="it returned" if not self.done else "its result said done")

    def local_trial_dir(self) -> str:
        """A folder for the user's own files: the trial's folder if storage is local."""
        if self.spec.storage.is_local:
            os.makedirs(self.spec.trial_path, exist_ok=True)
            return self.spec.trial_path
        if self.local_dir is None:
            self.local_dir = scratch.mkdtemp(f"dasktune-{self.spec.trial_id}-")
        return self.local_dir

    # ------------------------------------------------------------ gangs
    def _desk(self) -> GangDesk:
        if self._gangs is None:
            raise RuntimeError("reserve_workers() needs a trial started by dasktune's "
                               "executor")
        return self._gangs

    def reserve_workers(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                        timeout: float | None = None) -> WorkerGang:
        """Reserve a distinct worker per bundle, all or none (see :func:`reserve_workers`)."""
        try:
            return self._desk().reserve(bundles, strategy, timeout)
        except GangStopped:
            raise StopTrial() from None

    def release_workers(self, gang: WorkerGang) -> None:
        """Give ``gang``'s slots back (idempotent)."""
        self._desk().release(gang)

    def gang_lost(self, gang: WorkerGang) -> list[str]:
        """The workers of ``gang`` that were lost ([] while it is whole)."""
        return self._desk().lost(gang)

    def wait_gang_lost(self, gang: WorkerGang, timeout: float | None = None) -> list[str]:
        """Wait up to ``timeout`` s for a worker of ``gang`` to be lost; :meth:`gang_lost`."""
        return self._desk().wait_lost(gang, timeout)

    def gang_retiring(self, gang: WorkerGang) -> list[str]:
        """The workers of ``gang`` that are retiring ([] while none is; see :func:`gang_retiring`)."""
        return self._desk().retiring(gang)

    def at_end(self, fn: Callable[[bool], None]) -> None:
        """Call ``fn(failed)`` in the trial's thread when this attempt ends."""
        self._at_end.append(fn)

    def close(self, failed: bool = False) -> None:
        """End the attempt: the :meth:`at_end` calls (last registered first), then
        the scratch folder goes."""
        while self._at_end:
            fn = self._at_end.pop()
            try:
                fn(failed)
            except Exception:  # noqa: BLE001 - the trial is over: a cleanup only warns
                logger.warning("a cleanup at the end of trial %s failed",
                               self.spec.trial_id, exc_info=True)
        if self.local_dir:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def stop_dict_hit(stop: dict[str, Any] | None, result: dict[str, Any]) -> bool:
    """Ray's dict stopping rule: any key whose reported value reached its bound.

    A key the trial never reports is an error that names it (never a silent run-on).
    """
    if not stop:
        return False
    for key, bound in stop.items():
        if key not in result:
            raise ValueError(
                f"stop criterion {key!r} is not in the reported result "
                f"({reported_keys(result)})"
            )
        if result[key] >= bound:
            return True
    return False


# ---------------------------------------------------------------------- binding
def bind_session(session: TrialSession | None) -> None:
    """Make ``session`` the calling thread's trial (None: no trial), where ``tune.report``
    and ``get_context`` find it; the attempt runner calls it around a trainable."""
    _local.session = session
    with _sessions_lock:
        if session is None:
            _sessions.pop(threading.get_ident(), None)
        else:
            _sessions[threading.get_ident()] = session


def _current(what: str) -> TrialSession | None:
    session = getattr(_local, "session", None)
    if session is not None:
        return session
    with _sessions_lock:
        live = list(_sessions.values())
    # A thread the user started inside a trial: unambiguous only if one trial runs here.
    return live[0] if len(live) == 1 else None


def current_session() -> TrialSession | None:
    """The trial running in this thread (or the only one in this process), or None."""
    return _current("session")


def report(metrics: dict[str, Any] | None = None, *, checkpoint: Checkpoint | None = None,
           checkpoint_dir_name: str | None = None, **kwargs: Any) -> None:
    """Report metrics (and optionally a checkpoint) from inside a trial.

    With a checkpoint, returns only after it is committed to the experiment's storage,
    so the trial never runs more than one checkpoint interval ahead of what a
    restart can resume from. ``checkpoint_dir_name`` is accepted for Ray
    compatibility; checkpoints keep dasktune's ``checkpoint_NNNNNN`` names, which
    retention and restore rely on.
    """
    del checkpoint_dir_name
    session = _current("report")
    if session is None:
        raise RuntimeError("tune.report() was called outside of a dasktune trial")
    if metrics is None:
        metrics = kwargs
    elif kwargs:
        metrics = {**metrics, **kwargs}
    session.report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from (the newest committed one), or None on a fresh start."""
    session = _current("get_checkpoint")
    return session.latest_checkpoint if session is not None else None


def at_attempt_end(fn: Callable[[bool], None]) -> None:
    """Call ``fn(failed)`` in the running trial's thread when its attempt ends (for
    integrations that open something per trial, e.g. an MLflow run, to close it)."""
    session = _current("at_attempt_end")
    if session is None:
        raise RuntimeError("at_attempt_end() was called outside of a dasktune trial")
    session.at_end(fn)


def _gang_session(what: str) -> TrialSession:
    session = _current(what)
    if session is None:
        raise RuntimeError(f"{what}() was called outside of a dasktune trial")
    return session


def reserve_workers(bundles: list[dict[str, float]], strategy: str = "PACK",
                    timeout: float | None = None) -> WorkerGang:
    """Reserve a worker process per bundle for the running trial, all or none.

    Blocks until the driver granted every bundle (waiting its turn: requests are served
    first come, first served, and the trial's own slot is lent to the cluster while it
    waits). ``strategy`` is Ray's: ``PACK``/``STRICT_PACK`` (same host preferred /
    required), ``SPREAD``/``STRICT_SPREAD`` (distinct hosts preferred / required);
    every bundle gets a worker process of its own. The slots are the trial's until
    :func:`release_workers` or the attempt's end.

    Raises:
        ValueError: at once, if the cluster can never offer the bundles.
        TimeoutError: when ``timeout`` s passed first.
        RuntimeError: outside a trial.
    """
    return _gang_session("reserve_workers").reserve_workers(bundles, strategy, timeout)


def release_workers(gang: WorkerGang) -> None:
    """Give the slots of ``gang`` back (idempotent; also done when the attempt ends)."""
    _gang_session("release_workers").release_workers(gang)


def gang_lost(gang: WorkerGang) -> list[str]:
    """The workers of ``gang`` that left the cluster ([] while it is whole). A lost gang's
    slots are free again: stop its ranks and reserve a fresh gang."""
    return _gang_session("gang_lost").gang_lost(gang)


def wait_gang_lost(gang: WorkerGang, timeout: float | None = None) -> list[str]:
    """Block up to ``timeout`` s until a worker of ``gang`` is lost; as :func:`gang_lost`."""
    return _gang_session("wait_gang_lost").wait_gang_lost(gang, timeout)


def gang_retiring(gang: WorkerGang) -> list[str]:
    """The workers of ``gang`` that are retiring gracefully ([] while none is): a
    ``retire_workers``, an adaptive scale-down, a batch job's end or a SIGTERM under a
    nanny. Their retirement waits until the gang is released (a worker already closing:
    at most ``dasktune.executor.evacuate-timeout``): checkpoint, stop the ranks,
    :func:`release_workers` and reserve a fresh gang. A retired worker stays listed."""
    return _gang_session("gang_retiring").gang_retiring(gang)


class TrialResources(dict):
    """A trial's resources, ``{"CPU": 2.0, ..., "gpu_ids": [...]}``, that also answer as
    the ``PlacementGroupFactory`` Ray's ``get_trial_resources()`` returns does.

    ``bundles`` is the trial's own request, then the bundles of the gang reserved with
    the trial when it started (Ray's convention: bundle 0 is the trial's), if one was."""

    gang_bundles: list[dict[str, float]] = []  # set per instance; never mutated

    @property
    def required_resources(self) -> dict[str, float]:
        """The trial's own request (its actor's; a gang's bundles are in ``bundles``)."""
        return {k: v for k, v in self.items() if k != "gpu_ids"}

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [self.required_resources, *(dict(b) for b in self.gang_bundles)]

    @property
    def head_cpus(self) -> float:
        return float(self.get("CPU", 0.0))


class TrialContext:
    """What a trial knows about itself (Ray's ``tune.get_context()``)."""

    def __init__(self, session: TrialSession | None):
        self._session = session

    def _spec(self) -> TrialSpec:
        if self._session is None:
            raise RuntimeError("tune.get_context() is only meaningful inside a dasktune trial")
        return self._session.spec

    def get_trial_id(self) -> str:
        return self._spec().trial_id

    def get_trial_name(self) -> str:
        return self._spec().trial_name

    def get_trial_dir(self) -> str:
        self._spec()  # raises RuntimeError outside a trial
        assert self._session is not None
        return self._session.local_trial_dir()

    def get_trial_resources(self) -> TrialResources:
        spec = self._spec()
        resources = TrialResources({**spec.resources, "gpu_ids": list(spec.gpu_ids)})
        if spec.gang is not None:
            resources.gang_bundles = [dict(b) for b in spec.gang.bundles]
        return resources

    def get_experiment_name(self) -> str:
        return self._spec().experiment_name

    def get_storage(self) -> ExperimentStorage:
        return self._spec().storage

    def get_attempt(self) -> int:
        return self._spec().attempt

    def get_world_size(self) -> int:
        return 1

    def get_world_rank(self) -> int:
        return 0

    def get_local_rank(self) -> int:
        return 0


def get_context() -> TrialContext:
    """The running trial's context (errors on use outside a trial)."""
    return TrialContext(_current("get_context"))


def node_ip(worker_address: str = "") -> str:
    """The IP a trial reports as ``node_ip``: its worker's host, else this host's."""
    if "://" in worker_address:
        host = worker_address.split("://", 1)[1].rsplit(":", 1)[0]
        return host.strip("[]")
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
