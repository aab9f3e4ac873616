"""The driver loop: asks search for trials, applies scheduler decisions, talks to one executor.

One thread, no Dask. Each pass: fill free slots (``scheduler.choose_trial_to_run``,
else a new suggestion from search), wait briefly for executor events, and route
each report through loggers, searcher, scheduler and stopper, in report order.

Where a report travels: ``tune.report`` (worker) -> actor buffer -> executor poll
-> :meth:`TuneController._on_reports` -> callbacks (``result.json``, ``progress.csv``,
TensorBoard, dashboard) -> searcher -> scheduler -> stop decision.

Reports carry the attempt that made them; one from an attempt that is not the
trial's current one (a zombie after a partition, or a stopped attempt's tail) is
dropped. After a restart, iterations already logged are not logged again.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cloudpickle

from dasktune import _dask_config
from dasktune.callback import Callback, CallbackList
from dasktune.checkpoint import Checkpoint
from dasktune.executor import (
    FINISHED,
    LOST,
    REPORTS,
    START_FAILED,
    STARTED,
    UNQUEUED,
    WORKER_ADDED,
    WORKER_LOST,
    WORKER_RETIRING,
    ExecEvent,
)
from dasktune.logger import EXPR_ERROR_FILE
from dasktune.result import EARLY_STOPPED, SHOULD_CHECKPOINT
from dasktune.results import AUTO_RESULT_KEYS, TuneError
from dasktune.session import TrialSpec
from dasktune.storage import StorageError
from dasktune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED, Placement, Trial

if TYPE_CHECKING:
    from concurrent.futures import Future

    from dasktune.config import CheckpointConfig, FailureConfig, TuneConfig
    from dasktune.executor import DaskExecutor
    from dasktune.schedulers import TrialScheduler
    from dasktune.search import SearchAlgorithm
    from dasktune.stopper import Stopper
    from dasktune.storage import ExperimentStorage

logger = logging.getLogger(__name__)

# What the controller is doing to a RUNNING attempt, beyond waiting for reports.
_STOPPING = "stopping"  # ended (TERMINATED/ERROR): wait for the actor to finish
_PAUSING = "pausing"  # checkpoint, then PAUSED
_EXPLOITING = "exploiting"  # PBT: restart with a new config from a donor checkpoint
_REQUEUE = "requeue"  # restart from the latest checkpoint (a graceful move)
_MIN_SAVE_GAP = 0.5
_SAVE_SHARE = 19.0  # gap between state saves, in multiples of the last save's duration
_MAX_SAVE_GAP = 30.0
_ERROR_RETRY_S = 5.0  # error.txt writes that failed are retried this often


class _Context:
    """What schedulers may see of the experiment (read-only by convention)."""

    def __init__(self, controller: TuneController):
        self._c = controller

    def get_trials(self) -> list[Trial]:
        return self._c.trials

    def get_live_trials(self) -> list[Trial]:
        return [t for t in self._c.trials if not t.is_finished]

    def time(self) -> float:
        return time.time()

    def search_finished(self) -> bool:
        """Whether the searcher will suggest no more trials (HyperBand: a bracket that
        will not fill may halve with the trials it has)."""
        return self._c.search_alg.is_finished()

    @property
    def storage(self) -> ExperimentStorage:
        """The experiment's storage (PBT writes its ``log_config`` policy files there)."""
        return self._c.storage


class TuneController:
    """Runs one experiment to the end on an executor."""

    def __init__(
        self,
        *,
        trainable: Any,
        trainable_name: str,
        storage: ExperimentStorage,
        search_alg: SearchAlgorithm,
        scheduler: TrialScheduler,
        executor: DaskExecutor,
        callbacks: list[Callback],
        stopper: Stopper,
        stop_dict: dict[str, Any] | None,
        resources_for: Callable[[dict[str, Any]], dict[str, float]],
        metric: str | list[str] | None,
        mode: str | list[str] | None,
        max_concurrent: int | None,
        time_budget_s: float | None,
        failure_config: FailureConfig,
        checkpoint_config: CheckpointConfig,
        params: dict[str, Any] | None = None,
        trials: list[Trial] | None = None,
        save_state: Callable[..., Future[float] | None] | None = None,
        can_scale: bool = False,
        reporter: Any = None,
        path_check: Any = None,
        tune_config: TuneConfig | None = None,
    ):
        self.trainable = trainable
        # Name creators and reuse_actors; the state writer carries it on restore.
        self.tune_config = tune_config or getattr(save_state, "tune_config", None)
        self._reuse_instances = bool(getattr(self.tune_config, "reuse_actors", False))
        # Pickled here, once, with cloudpickle: Dask would send an importable function by
        # reference, which fails on workers that cannot import the user's module.
        self._trainable_blob = cloudpickle.dumps(trainable)
        self.trainable_name = trainable_name
        self.storage = storage
        self.search_alg = search_alg
        self.scheduler = scheduler
        self.executor = executor
        self.callbacks = CallbackList(callbacks)
        self.stopper = stopper
        self.stop_dict = stop_dict
        self.resources_for = resources_for
        self.metric = metric
        self.mode = mode
        self.max_concurrent = max_concurrent
        self.time_budget_s = time_budget_s
        self.failure_config = failure_config
        self.checkpoint_config = checkpoint_config
        self.params = params or {}
        self.trials: list[Trial] = list(trials or [])
        self._by_id = {t.trial_id: t for t in self.trials}
        # PENDING and PAUSED trials by their place in self.trials, so that picking the
        # next one and "is any waiting?" cost no scan of every trial (10k+ of them).
        self._pos = {t.trial_id: i for i, t in enumerate(self.trials)}
        self._waiting: dict[str, list[tuple[int, str]]] = {PENDING: [], PAUSED: []}
        self._n_waiting = {PENDING: 0, PAUSED: 0}
        for trial in self.trials:
            self._index(trial, None)
        self._save_state = save_state
        self._can_scale = can_scale
        # Local storage: workers that join later are checked before their first trial.
        self._path_check = path_check
        self._reporter = reporter
        self._ctx = _Context(self)
        self._action: dict[str, str] = {}
        self._pending_exploit: dict[str, Any] = {}
        # An exploited trial's next start restores its donor's checkpoint: its metadata.
        self._restore_meta: dict[str, dict[str, Any]] = {}
        self._iteration = 0
        self._start = time.monotonic()
        self._last_save = float("-inf")  # due at once, however young the clock
        self._save_period = _dask_config.get_seconds("controller.checkpoint-period")
        self._save_gap = _MIN_SAVE_GAP
        self._save_took = 0.0  # the last save's time: building it, then writing it
        self._writing: Future[float] | None = None  # the last save's write, if in flight
        self._warned_on_demand = False
        self._unwritten_errors: list[tuple[Trial, str]] = []
        self._errors_tried = float("-inf")  # a retry is due at once, as for _last_save
        self._stop_all = False
        self._raise: BaseException | None = None
        self._waiting_reason: str | None = None
        self._waiting_trial: Trial | None = None  # the trial _waiting_reason is about
        self._dirty = False
        self._retiring: set[str] = set()
        self._no_workers_since: float | None = None
        self._no_workers_timeout = _dask_config.get_seconds("executor.no-workers-timeout")
        self.num_reports = 0
        # A scheduler that decides per result (ASHA, HyperBand, PBT, ...) gets results
        # one at a time: report() waits for the driver to receive each, so a decision
        # lands at most one iteration late. FIFO runs unthrottled.
        from dasktune.schedulers import FIFOScheduler

        self._sync_reports = bool(_dask_config.get("executor.sync-reports")) or \
            type(scheduler) is not FIFOScheduler
        # Successors queued on busy actors (executor.queue_after): only where asking the
        # searcher early costs nothing (its suggestions ignore results) and the FIFO
        # scheduler's choice is "the next trial". An elastic cluster should grow for a
        # waiting trial instead.
        self._queue_next = bool(_dask_config.get("executor.queue-next")) and \
            type(scheduler) is FIFOScheduler and not can_scale and \
            bool(getattr(search_alg, "suggests_ahead", False)) and \
            hasattr(executor, "queue_after")
        # A scheduler that picks which waiting trial runs next (PBT, HyperBand, median
        # stopping) must see the population, not only the trials that had a free slot:
        # with a searcher that suggests ahead, keep up to this many trials PENDING, as
        # Ray does (TUNE_MAX_PENDING_TRIALS_PG, 16 or more).
        from dasktune.schedulers import TrialScheduler

        self._scheduler_chooses = \
            type(scheduler).choose_trial_to_run is not TrialScheduler.choose_trial_to_run
        self._max_pending = int(_dask_config.get("controller.max-pending-trials")) if \
            self._scheduler_chooses and bool(getattr(search_alg, "suggests_ahead", False)) \
            else 0
        # Each running trial may have a line of queued successors on its actor: long
        # enough to cover controller.queue-ahead of work at the trials' recent run time,
        # so a driver that pauses that long (a state save, a GC pass) idles no slot.
        self._queued: dict[str, str] = {}  # queued trial -> the trial it waits behind
        self._behind: dict[str, str] = {}  # trial -> the queued trial right behind it
        self._need_next: set[str] = set()  # last in a line that is still short
        self._unqueuing: set[str] = set()
        self._queue_ahead = _dask_config.get_seconds("controller.queue-ahead")
        self._max_line = max(1, int(_dask_config.get("controller.max-queued-per-slot")))
        self._run_time: float | None = None  # recent trials' run time (moving average)

    # ------------------------------------------------------------------ loop
    def run(self) -> list[Trial]:
        from dasktune import tuner_build

        # Before the first trial exists, so a bad option costs no work (Ray: at fit()).
        tuner_build.check_checkpoint_config(self.trainable, self.checkpoint_config)
        self.callbacks.setup(stop=self.stop_dict, num_samples=None,
                             total_num_samples=self.search_alg.total_samples,
                             storage=self.storage, controller=self)
        for trial in self.trials:
            if trial.status == PENDING:
                self.scheduler.on_trial_add(self._ctx, trial)
        try:
            while not self._finished():
                self._step()
        finally:
            self._shutdown()
        if self._raise is not None:
            raise self._raise
        return self.trials

    def _finished(self) -> bool:
        if self.executor.num_running:
            return False
        if self._stop_all:
            return True
        if self._n_waiting[PENDING] or self._n_waiting[PAUSED]:
            return False
        return self.search_alg.is_finished()

    def _step(self) -> None:
        self._iteration += 1
        self.callbacks.on_step_begin(iteration=self._iteration, trials=self.trials)
        started = self._fill_slots()
        # A suggestion computed on the searcher's thread: look again soon for it.
        timeout = 0.0 if started else 0.005 if getattr(self.search_alg, "asking", False) \
            else 0.2
        for event in self.executor.events(timeout):
            self._on_event(event)
            if event.kind != REPORTS:
                # A slot may have freed: refill it now, not after the rest of a long
                # queue of reports from other trials.
                self._fill_slots()
        for trial in self.scheduler.trials_to_stop(self._ctx):
            if trial.status in (PENDING, PAUSED):
                self._complete(trial, trial.last_result, early_stopped=True)
        self._check_budget()
        self.callbacks.on_step_end(iteration=self._iteration, trials=self.trials)
        now = time.monotonic()
        if self._unwritten_errors and now - self._errors_tried >= _ERROR_RETRY_S:
            self._flush_errors()
        if self._dirty and now - self._last_save >= max(self._save_period, self._save_gap):
            self.save()
        if self._reporter is not None:
            self._reporter.maybe_report(self.trials, self.status_line(),
                                        total=self.search_alg.total_samples)

    def status_line(self) -> str:
        """The console's (and the dashboard's) note on the experiment: why it waits."""
        waiting = self._waiting_trial
        if waiting is not None and waiting.status not in (PENDING, PAUSED):
            return ""  # the trial that waited ended (e.g. stopped early) without starting
        if self._waiting_reason:
            return f"waiting for resources: {self._waiting_reason}"
        return ""

    def _shutdown(self) -> None:
        self.executor.shutdown()
        close = getattr(self.search_alg, "close", None)
        if close is not None:
            close()
        if self._unwritten_errors:
            self._flush_errors()
        for trial in self.trials:
            if trial.status == RUNNING:  # interrupted: resumable on restore
                self._set_status(trial, PENDING)
        try:
            self.save(wait=True)
        finally:
            try:
                self.callbacks.on_experiment_end(trials=self.trials)
            finally:
                self.storage.drain()  # result files closed on its io thread
            if self._reporter is not None:
                self._reporter.final(self.trials)

    def _save_soon(self) -> None:
        """A trial ended: save soon, not per trial (the state grows with the trial
        count, so saving it per completion would be quadratic)."""
        self._dirty = True
        if time.monotonic() - self._last_save >= self._save_gap:
            self.save()

    def save(self, wait: bool = False) -> None:
        """Save the experiment state; ``wait``: written before this returns (the last
        save). Otherwise the file is written on the storage's io thread: with 10k
        trials it takes tens of milliseconds, a pause in which no ended trial's slot
        gets its successor."""
        if self._save_state is None:
            return
        if not self._saved_write(wait):
            self._dirty = True  # the last one is still being written: next period
            return
        start = self._last_save = time.monotonic()
        self._dirty = False
        try:
            self._writing = self._save_state(self, wait=wait)
        except StorageError as exc:  # storage outage: keep running, retry next period
            logger.warning("could not save the experiment state: %s", exc)
            self._dirty = True
        self._save_took = time.monotonic() - start
        self._set_save_gap()

    def _saved_write(self, wait: bool) -> bool:
        """Whether the last state write (on the io thread) is done; its outcome counted."""
        writing = self._writing
        if writing is None:
            return True
        if not writing.done() and not wait:
            return False
        self._writing = None
        try:
            self._save_took += writing.result()
        except StorageError as exc:
            logger.warning("could not save the experiment state: %s", exc)
            self._dirty = True
        self._set_save_gap()
        return True

    def _set_save_gap(self) -> None:
        # Saving takes at most ~5% of the time (Ray's "auto" checkpoint period does the
        # same), counting the write on the io thread: with 10k trials the state is big.
        self._save_gap = min(_MAX_SAVE_GAP, max(_MIN_SAVE_GAP, _SAVE_SHARE * self._save_took))

    # ------------------------------------------------------------- starting
    def _concurrency_ok(self) -> bool:
        return self.max_concurrent is None or self.executor.num_running < self.max_concurrent

    def _fill_slots(self) -> int:
        started = 0
        if self._stop_all:
            return 0
        while self._n_waiting[PENDING] < self._max_pending and \
                not self.search_alg.is_finished() and self._new_trial():
            pass
        while self._concurrency_ok():
            trial = self._choose_trial_to_run()
            if trial is None:
                if self._queued:
                    if self.search_alg.is_finished() or not self._new_trial():
                        self._take_back_queued()  # a free slot and no new trial: use it
                        break
                    continue
                if self._n_waiting[PENDING] or self.search_alg.is_finished():
                    break
                if not self._new_trial():
                    break
                continue
            if not self._try_start(trial):
                break
            started += 1
        if self._queue_next and self._need_next:
            self._queue_successors()
        return started

    def _choose_trial_to_run(self) -> Trial | None:
        if self._scheduler_chooses:
            return self.scheduler.choose_trial_to_run(self._ctx)
        # The base class's choice (the first PENDING trial, else the first PAUSED one)
        # from the index, minus the queued trials (queued only under FIFO).
        return self._first(PENDING) or self._first(PAUSED)

    # ------------------------------------------------------------- status index
    def _set_status(self, trial: Trial, status: str) -> None:
        old = trial.status
        trial.set_status(status)
        if old != status:
            self._index(trial, old)

    def _index(self, trial: Trial, old: str | None) -> None:
        if old in self._n_waiting:
            self._n_waiting[old] -= 1  # type: ignore[index]
        if trial.status in self._n_waiting:
            self._n_waiting[trial.status] += 1
            heapq.heappush(self._waiting[trial.status],
                           (self._pos[trial.trial_id], trial.trial_id))

    def _first(self, status: str) -> Trial | None:
        """The first trial (in trial order) with ``status`` that is not queued."""
        heap, skipped = self._waiting[status], []
        found = None
        while heap:
            tid = heap[0][1]
            if self._by_id[tid].status != status:
                heapq.heappop(heap)  # left that status since it was indexed
            elif tid in self._queued:
                skipped.append(heapq.heappop(heap))
            else:
                found = self._by_id[tid]
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return found

    # ------------------------------------------------------------- queued successors
    def _queue_successors(self) -> None:
        """Lengthen every line of queued successors that is short (see __init__)."""
        for tid in list(self._need_next):
            running = self._by_id.get(tid)
            if running is None or tid in self._action or tid in self._behind or \
                    tid in self._unqueuing or \
                    (running.status != RUNNING and tid not in self._queued):
                self._need_next.discard(tid)
                continue
            trial = self._successor_candidate()
            if trial is None:
                return
            if trial.resources != running.resources:
                return  # it waits for a slot that fits it
            spec = self._spec_for(trial)
            if not self.executor.queue_after(tid, spec):
                self._need_next.discard(tid)
                continue
            self._need_next.discard(tid)
            self._queued[trial.trial_id] = tid
            self._behind[tid] = trial.trial_id
            if self._waiting_trial is trial:
                self._waiting_reason = self._waiting_trial = None
            self._extend_line(tid)

    def _extend_line(self, tid: str) -> None:
        """Mark the line of trials queued behind ``tid`` (or behind the trial it waits
        behind) to be lengthened if it is shorter than the trials' recent run time
        asks for."""
        while tid in self._queued:  # to the running trial at its head
            tid = self._queued[tid]
        want = 1
        if self._run_time:
            want = min(self._max_line, max(1, math.ceil(self._queue_ahead / self._run_time)))
        n = 0
        while tid in self._behind and n < want:
            tid = self._behind[tid]
            n += 1
        if n < want and tid not in self._behind:
            self._need_next.add(tid)

    def _note_run_time(self, trial: Trial) -> None:
        """A trial ran to its end: its run time moves the average that sizes lines."""
        p = trial.placements[-1] if trial.placements else None
        if p is None or p.end is None:
            return
        took = max(p.end - p.start, 1e-4)
        self._run_time = took if self._run_time is None else 0.8 * self._run_time + 0.2 * took

    def _successor_candidate(self) -> Trial | None:
        """The trial that waits for a slot if it never ran, else a new one."""
        waiting = self._waiting_trial
        if waiting is not None and waiting.status == PENDING and not waiting.placements and \
                waiting.trial_id not in self._queued and not waiting.checkpoint and \
                not waiting.restore_path:
            return waiting
        if self._stop_all or self.search_alg.is_finished() or not self._new_trial():
            return None
        trial = self.trials[-1]
        return trial if trial.trial_id not in self._queued else None

    def _take_back_queued(self) -> None:
        """A slot is free but the search has nothing new: take back one queued trial,
        the last of a line (it then starts here instead of behind a running one)."""
        for tid in self._queued:
            if tid in self._unqueuing or tid in self._behind:
                continue
            trial = self._by_id[tid]
            if self.executor.place(trial.resources) is None:
                return
            self._unqueuing.add(tid)
            self.executor.unqueue(tid)
            return

    def _new_trial(self) -> bool:
        from dasktune import tuner_build

        suggestion = self.search_alg.next_trial()
        if suggestion is None:
            return False
        trial = Trial(trial_id=suggestion.trial_id, config=suggestion.config,
                      experiment_tag=suggestion.experiment_tag,
                      trainable_name=self.trainable_name)
        trial.resources = self.resources_for(trial.config)
        trial.evaluated_params = getattr(suggestion, "evaluated_params", None) or {}
        tuner_build.apply_name_creators(trial, self.tune_config)
        dirname = trial.custom_dirname or f"{self.trainable_name}_{trial.dirname}"
        trial.path = self.storage.trial_path(dirname)
        self._pos[trial.trial_id] = len(self.trials)
        self.trials.append(trial)
        self._by_id[trial.trial_id] = trial
        self._index(trial, None)
        self.scheduler.on_trial_add(self._ctx, trial)
        self._dirty = True
        return True

    def _try_start(self, trial: Trial) -> bool:
        worker = self.executor.place(trial.resources)
        while worker is not None and self._path_check is not None and \
                self._path_check.blind([worker]):
            logger.warning("worker %s cannot see the storage folder %s (another host or "
                           "mount): no trials will run on it", worker, self.storage.uri)
            self.executor.exclude(worker)
            worker = self.executor.place(trial.resources)
        if worker is None:
            why = self.executor.can_ever_fit(trial.resources)
            if why is not None and not self._can_scale:
                raise ValueError(f"trial {trial.trial_id} can never be placed: {why}")
            if not self.executor.workers():
                why = "the cluster has no workers"
                if self._no_workers_since is None:
                    self._no_workers_since = time.monotonic()
                elif time.monotonic() - self._no_workers_since > self._no_workers_timeout and \
                        not self.executor.num_running:
                    raise RuntimeError(
                        f"the cluster has had no workers for {self._no_workers_timeout:.0f}s "
                        "(dasktune.executor.no-workers-timeout); the experiment can be "
                        f"continued with Tuner.restore({self.storage.uri!r}, ...)")
            else:
                self._no_workers_since = None
            if self._can_scale:
                # Adaptive sizes the cluster from the scheduler's tasks: show it this trial.
                # (Withdrawn when it starts, in executor.start, or ends: _complete/_error.)
                self.executor.demand(trial.trial_id, trial.resources)
            self._waiting_reason = why or "all workers busy"
            self._waiting_trial = trial
            return False
        self._waiting_reason = None
        self._waiting_trial = None
        self._no_workers_since = None
        was_paused = trial.status == PAUSED
        spec = self._spec_for(trial)
        # A restart continues the iteration count of its checkpoint, or restarts at 0.
        self._set_status(trial, RUNNING)
        self.executor.start(spec, trial.resources, worker, self.params)
        host = self.executor.workers().get(worker, {}).get("host", "")
        trial.placements.append(Placement(attempt=trial.attempt, worker=worker, host=host,
                                          start=time.time()))
        if was_paused:
            self.scheduler_hook("on_trial_unpause", trial)
        self._dirty = True
        return True

    def _spec_for(self, trial: Trial) -> TrialSpec:
        """The trial's next attempt, as its actor gets it."""
        trial.attempt += 1
        restore = trial.restore_path or trial.checkpoint
        meta = self._restore_meta.pop(trial.trial_id, None) if trial.restore_path else None
        meta = meta or self._checkpoint_meta(trial, restore)
        spec = TrialSpec(
            trial_id=trial.trial_id,
            trial_name=trial.trial_name,
            experiment_name=self.storage.name,
            config=trial.config,
            trainable=self._trainable_blob,
            storage=self.storage,
            trial_path=trial.path or "",
            attempt=trial.attempt,
            resources=dict(trial.resources),
            restore_path=restore,
            restore_meta=meta,
            stop=self.stop_dict,
            checkpoint_frequency=self.checkpoint_config.checkpoint_frequency,
            checkpoint_at_end=bool(self.checkpoint_config.checkpoint_at_end),
            next_checkpoint_index=self._next_checkpoint_index(trial),
            experiment_tag=trial.experiment_tag,
            max_buffered=int(_dask_config.get("executor.max-buffered-reports")),
            sync_reports=self._sync_reports,
            isolate=bool(_dask_config.get("executor.isolate")),
            reuse_instance=self._reuse_instances,
        )
        # restore_path stays until the trial commits a checkpoint of its own: until then
        # a retry must start from it too, and retention must not delete it (a PBT donor
        # may be committing newer checkpoints while this attempt still reads it).
        return spec

    def scheduler_hook(self, name: str, trial: Trial) -> None:
        hook = getattr(self.search_alg, name, None)
        if hook is not None:
            hook(trial.trial_id)

    def _checkpoint_meta(self, trial: Trial, path: str | None) -> dict[str, Any]:
        if not path:
            return {}
        for info in trial.checkpoints:
            if info["path"] == path:
                return {"training_iteration": info.get("iteration", 0),
                        "time_total_s": info.get("time_total_s", 0.0)}
        manifest = self.storage.read_manifest(path) or {}
        return {"training_iteration": manifest.get("training_iteration", 0),
                "time_total_s": manifest.get("time_total_s", 0.0)}

    def _next_checkpoint_index(self, trial: Trial) -> int:
        best = -1
        for info in trial.checkpoints:
            try:
                best = max(best, int(info["path"].rsplit("_", 1)[-1]))
            except ValueError:
                pass
        return best + 1

    # ------------------------------------------------------------- events
    def _on_event(self, event: ExecEvent) -> None:
        if event.kind == WORKER_LOST:
            self.executor.lose_worker(event.info["worker"])
            return
        if event.kind == WORKER_ADDED:
            return  # the step refills slots after any event but reports
        if event.kind == WORKER_RETIRING:
            addr = event.info["worker"]
            moved = self.move_trials_off(addr)
            logger.info("worker %s is retiring: moving trials %s", addr, moved)
            self._retiring.add(addr)
            self.executor.retire_when_free(addr)
            return
        trial = self._by_id.get(event.trial_id)
        if trial is None or event.attempt != trial.attempt:
            logger.debug("dropping %s from stale attempt %s of %s", event.kind, event.attempt,
                         event.trial_id)
            return
        if event.kind == UNQUEUED:
            tid = trial.trial_id
            self._unqueuing.discard(tid)
            self._need_next.discard(tid)
            ahead = self._queued.pop(tid, None)
            after = self._behind.pop(tid, None)
            if ahead is not None and self._behind.get(ahead) == tid:
                if after is not None:  # out of the line: the next one closes the gap
                    self._behind[ahead] = after
                    self._queued[after] = ahead
                else:
                    del self._behind[ahead]
                if self._queue_next:
                    self._extend_line(ahead)
            self._dirty = True  # PENDING again, to start in the next free slot
            return
        if event.kind in (FINISHED, LOST, START_FAILED):
            self._need_next.discard(trial.trial_id)
            self._behind.pop(trial.trial_id, None)
        if event.kind == STARTED:
            if trial.trial_id in self._queued:
                self._on_queued_started(trial, event.info)
            elif trial.placements:
                p = trial.placements[-1]
                p.host = event.info.get("host", p.host)
            if self._queue_next and trial.status == RUNNING:
                self._extend_line(trial.trial_id)
            self.callbacks.on_trial_start(iteration=self._iteration, trials=self.trials,
                                          trial=trial)
            if trial.checkpoint and trial.attempt > 1:
                self.callbacks.on_trial_restore(iteration=self._iteration, trials=self.trials,
                                                trial=trial)
        elif event.kind in (REPORTS, FINISHED):
            self._on_reports(trial, event.reports)
            if event.kind == FINISHED:
                self._on_finished(trial, event.error)
        elif event.kind == LOST:
            self._on_lost(trial, event.error or "worker lost")
        elif event.kind == START_FAILED:
            self._end_placement(trial, "error")
            self.executor.release(trial.trial_id)
            self._on_user_error(trial, event.error or "trial actor failed to start")

    def _on_queued_started(self, trial: Trial, info: dict[str, Any]) -> None:
        """A queued trial took over its predecessor's actor: it runs now."""
        self._unqueuing.discard(trial.trial_id)
        behind = self._queued.pop(trial.trial_id)
        self._behind.pop(behind, None)
        self._set_status(trial, RUNNING)
        worker = info.get("worker", "")
        trial.placements.append(Placement(attempt=trial.attempt, worker=worker,
                                          host=info.get("host", ""), start=time.time()))
        self._dirty = True
        if self._stop_all:  # taken back too late: stop it (left resumable at shutdown)
            self._action[trial.trial_id] = _STOPPING
            self.executor.stop(trial.trial_id)
        elif worker in self._retiring:
            self._action[trial.trial_id] = _REQUEUE
            self.executor.stop(trial.trial_id, checkpoint=True)

    def _on_reports(self, trial: Trial,
                    reports: list[tuple[int, dict[str, Any] | None, str | None]]) -> None:
        for _seq, result, ckpt in reports:
            if ckpt:
                self._register_checkpoint(trial, ckpt, result)
            action = self._action.get(trial.trial_id)
            if result is None or trial.status != RUNNING or action in (_STOPPING, _EXPLOITING):
                continue
            it = int(result.get("training_iteration", 0))
            if it <= trial.logged_iteration:
                continue  # re-executed after a restart: logged once already
            self.num_reports += 1
            # Like Ray, a result with only auto-filled keys (a bare ``{"done": True}`` from
            # step() or a returned dict) carries no metric: not checked, not judged.
            auto_only = all(k in AUTO_RESULT_KEYS for k in result)
            if self.metric is not None and not auto_only and \
                    not self._has_metrics(trial, result):
                continue
            trial.update_last_result(result)
            trial.logged_iteration = it
            self._dirty = True
            self.callbacks.on_trial_result(iteration=self._iteration, trials=self.trials,
                                           trial=trial, result=result)
            if result.pop(SHOULD_CHECKPOINT, False):  # a Callback asked (Ray's idiom)
                self._checkpoint_on_demand(trial)
            decision = None  # nothing for a scheduler to judge (as Ray's ASHA skips it)
            if action is None and not auto_only:
                # The scheduler first, as in Ray: what it adds to the result (the budget of
                # HyperBandForBOHB) reaches the searcher.
                decision = self.scheduler.on_trial_result(self._ctx, trial, result)
            self.search_alg.on_trial_result(trial.trial_id, result)
            try:
                done = bool(result.get("done")) or self.stopper(trial.trial_id, result)
            except ValueError as exc:
                self._stop_with_error(trial, str(exc))
                continue
            if action is not None:
                # Pausing or moving: it runs on only to its checkpoint, but a reached
                # stop criterion still ends it here.
                if done:
                    self._action.pop(trial.trial_id)
                    self._apply(trial, "STOP_DONE", result)
                continue
            if done:
                decision = "STOP_DONE"
            self._apply(trial, decision, result, checkpointed=bool(ckpt))
        if self.stopper.stop_all():
            self._stop_everything("stopper.stop_all() returned True")

    def _checkpoint_on_demand(self, trial: Trial) -> None:
        from dasktune.trainable import is_class_trainable

        if is_class_trainable(self.trainable):
            self.executor.checkpoint(trial.trial_id)
        elif not self._warned_on_demand:
            self._warned_on_demand = True
            logger.warning(
                "a Callback set SHOULD_CHECKPOINT for trial %s, but a function trainable "
                "is checkpointed only when it passes checkpoint= to tune.report; ignored",
                trial.trial_id)

    def _has_metrics(self, trial: Trial, result: dict[str, Any]) -> bool:
        metrics = self.metric if isinstance(self.metric, (list, tuple)) else [self.metric]
        for m in metrics:
            if m not in result:
                keys = sorted(k for k in result if k != "config")
                self._stop_with_error(
                    trial,
                    f"trial {trial.trial_id} reported a result without the metric {m!r} "
                    f"set in TuneConfig (reported keys: {keys})",
                )
                return False
        return True

    def _apply(self, trial: Trial, decision: Any, result: dict[str, Any],
               checkpointed: bool = False) -> None:
        from dasktune.schedulers import TrialScheduler

        tid = trial.trial_id
        if decision in (TrialScheduler.CONTINUE, TrialScheduler.NOOP, None):
            return
        if decision == TrialScheduler.PAUSE:
            self._action[tid] = _PAUSING
            # This very result came with a checkpoint: pause right here (as Ray does, at
            # the milestone), not after one more iteration and checkpoint.
            self.executor.stop(tid, checkpoint=not checkpointed)
            return
        if decision in (TrialScheduler.STOP, "STOP_DONE"):
            early = decision == TrialScheduler.STOP
            self._complete(trial, result, early_stopped=early)
            self._action[tid] = _STOPPING
            self.executor.stop(tid)
            return
        if hasattr(decision, "config") and hasattr(decision, "checkpoint"):  # Exploit
            self._action[tid] = _EXPLOITING
            self._pending_exploit[tid] = decision
            self.executor.stop(tid)
            return
        raise ValueError(f"scheduler returned an unknown decision {decision!r} for {tid}")

    def _complete(self, trial: Trial, result: dict[str, Any] | None,
                  early_stopped: bool = False) -> None:
        """TERMINATED: the trial is done (its attempt may still be winding down)."""
        if trial.is_finished:
            return
        self._set_status(trial, TERMINATED)
        self._unpin_restore(trial)  # nothing will restore it: its donor's checkpoint may go
        self.executor.withdraw(trial.trial_id)  # stopped while it waited for resources
        trial.last_result = dict(trial.last_result, done=True) if trial.last_result else {}
        if early_stopped:
            trial.stop_reason = "early_stopped"
        final = dict(result or trial.last_result)
        self.scheduler.on_trial_complete(self._ctx, trial, final)
        if early_stopped:
            final[EARLY_STOPPED] = True
        self.search_alg.on_trial_complete(trial.trial_id, result=final)
        self.callbacks.on_trial_complete(iteration=self._iteration, trials=self.trials,
                                         trial=trial)
        self._save_soon()

    def _release(self, trial: Trial) -> None:
        worker = trial.placements[-1].worker if trial.placements else None
        self.executor.release(trial.trial_id)
        if worker in self._retiring and self.executor.retire_when_free(worker):
            self._retiring.discard(worker)

    def _on_finished(self, trial: Trial, error: str | None) -> None:
        tid = trial.trial_id
        action = self._action.pop(tid, None)
        self._release(trial)
        if error and action != _STOPPING:
            self._end_placement(trial, "error")
            self._on_user_error(trial, error)
            return
        if action == _PAUSING:
            self._end_placement(trial, "paused")
            self._set_status(trial, PAUSED)
        elif action == _EXPLOITING:
            self._end_placement(trial, "exploited")
            exploit = self._pending_exploit.pop(tid)
            trial.config = dict(exploit.config)
            trial.restore_path = exploit.checkpoint
            # A new lineage from the donor's checkpoint: its iterations count on from
            # there (as in Ray) and are new results, not re-runs of ones logged already.
            donor = self._by_id.get(getattr(exploit, "donor_trial_id", ""))
            meta = self._checkpoint_meta(donor or trial, exploit.checkpoint)
            self._restore_meta[tid] = meta
            trial.logged_iteration = int(meta["training_iteration"])
            self._set_status(trial, PENDING)
        elif action == _REQUEUE:
            self._end_placement(trial, "moved")
            self._set_status(trial, PENDING)
        elif action == _STOPPING:
            self._end_placement(trial, "stopped")
        else:
            self._end_placement(trial, "done")
            self._note_run_time(trial)
            self._complete(trial, None)
        self._dirty = True

    def _on_lost(self, trial: Trial, why: str) -> None:
        tid = trial.trial_id
        action = self._action.get(tid)
        self._pending_exploit.pop(tid, None)
        self._end_placement(trial, "lost")
        self.executor.release(tid)
        if not trial.is_finished and action in (None, _REQUEUE, _PAUSING):
            # A move or pause commits its checkpoint just before the worker may go: adopt
            # it while the action still stands, so its result isn't a scheduler decision.
            self._adopt_unreported_checkpoint(trial)
        self._action.pop(tid, None)
        if trial.is_finished:
            return
        if action != _REQUEUE:  # a trial being moved off a leaving worker lost nothing
            trial.num_restarts += 1
        limit = self.failure_config.max_worker_losses
        if limit != -1 and trial.num_restarts > limit:
            self._error(trial, f"trial {tid} lost its worker {trial.num_restarts} times "
                               f"(FailureConfig.max_worker_losses={limit}); last: {why}")
            return
        logger.info("trial %s: %s; restarting from %s", tid, why,
                    trial.checkpoint or "scratch")
        self._set_status(trial, PAUSED if action == _PAUSING else PENDING)
        self.callbacks.on_trial_recover(iteration=self._iteration, trials=self.trials,
                                        trial=trial)
        self._dirty = True

    def _adopt_unreported_checkpoint(self, trial: Trial) -> None:
        """A worker can die after committing a checkpoint but before the driver heard of
        it: resume from that one if it belongs to the lost attempt and is not ahead of
        what was logged (so the result files keep no hole)."""
        if not trial.path:
            return
        newest = self.storage.latest_committed_checkpoint(trial.path)
        if not newest or newest == trial.checkpoint:
            return
        manifest = self.storage.read_manifest(newest) or {}
        it = int(manifest.get("training_iteration", 0))
        if int(manifest.get("attempt", -1)) != trial.attempt or it <= trial.checkpoint_iteration:
            return
        if it <= trial.logged_iteration:
            self._register_checkpoint(trial, newest, {"training_iteration": it,
                                                      "time_total_s": manifest.get(
                                                          "time_total_s", 0.0)})
        elif it == trial.logged_iteration + 1 and isinstance(manifest.get("result"), dict):
            result = dict(manifest["result"], config=trial.config)
            self._on_reports(trial, [(0, result, newest)])

    def _on_user_error(self, trial: Trial, error: str) -> None:
        trial.num_failures += 1
        self._write_error(trial, error)
        limit = self.failure_config.max_failures
        if not trial.is_finished and (limit == -1 or trial.num_failures <= limit) \
                and not self.failure_config.fail_fast:
            trial.error_msg = error
            self._set_status(trial, PENDING)
            self.callbacks.on_trial_recover(iteration=self._iteration, trials=self.trials,
                                            trial=trial)
            return
        self._error(trial, error)

    def _stop_with_error(self, trial: Trial, message: str) -> None:
        """End a trial for a mistake no retry can fix (e.g. a missing metric)."""
        self._write_error(trial, message)
        self._error(trial, message)
        self._action[trial.trial_id] = _STOPPING
        self.executor.stop(trial.trial_id)

    def _error(self, trial: Trial, error: str) -> None:
        if trial.is_finished:
            return
        trial.error_msg = error
        self._set_status(trial, ERROR)
        self.executor.withdraw(trial.trial_id)
        self.scheduler.on_trial_error(self._ctx, trial)
        self.search_alg.on_trial_complete(trial.trial_id, result=None, error=True)
        self.callbacks.on_trial_error(iteration=self._iteration, trials=self.trials, trial=trial)
        self._save_soon()
        fail_fast = self.failure_config.fail_fast
        if fail_fast:
            self._stop_everything(f"trial {trial.trial_id} errored and fail_fast is set")
            if fail_fast == "raise" and self._raise is None:
                self._raise = TuneError(f"trial {trial.trial_id} failed:\n{error}")

    def _write_error(self, trial: Trial, error: str) -> None:
        if not trial.path:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._unwritten_errors.append(
            (trial, f"Failure # {trial.num_failures} (occurred at {stamp})\n{error}\n"))
        self._flush_errors()

    def _flush_errors(self) -> None:
        """Append the failures not yet in their ``error.txt``; a storage outage keeps
        them for the next try (every few seconds, and at the end), never drops them."""
        self._errors_tried = time.monotonic()
        while self._unwritten_errors:
            trial, block = self._unwritten_errors[0]
            path = f"{trial.path}/{EXPR_ERROR_FILE}"
            try:
                old = self.storage.read_bytes(path).decode() if self.storage.exists(path) \
                    else ""
                self.storage.write_bytes(path, (old + block).encode())
            except Exception as exc:  # noqa: BLE001 - never let error reporting hide the error
                logger.warning("could not write %s (%s); retrying later", path, exc)
                return
            trial.error_file = path
            self._unwritten_errors.pop(0)

    def _end_placement(self, trial: Trial, outcome: str) -> None:
        if trial.placements and trial.placements[-1].end is None:
            trial.placements[-1].end = time.time()
            trial.placements[-1].outcome = outcome

    # ------------------------------------------------------------- checkpoints
    def _register_checkpoint(self, trial: Trial, path: str,
                             result: dict[str, Any] | None) -> None:
        metrics = {k: v for k, v in (result or trial.last_result or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        iteration = int((result or {}).get("training_iteration", trial.logged_iteration))
        info = {"path": path, "iteration": iteration,
                "time_total_s": float(metrics.get("time_total_s", 0.0)), "metrics": metrics}
        trial.checkpoints.append(info)
        trial.checkpoint = path
        trial.checkpoint_iteration = iteration
        self._enforce_retention(trial)
        self._unpin_restore(trial)  # the trial's own lineage now goes on from here
        self._dirty = True
        self.callbacks.on_trial_save(iteration=self._iteration, trials=self.trials, trial=trial)
        self.callbacks.on_checkpoint(iteration=self._iteration, trials=self.trials, trial=trial,
                                     checkpoint=Checkpoint(path, self.storage.fs))

    def _unpin_restore(self, trial: Trial) -> None:
        """Forget where ``trial`` was to restore from; the trial (a PBT donor) that owns
        that checkpoint may now delete it, so its retention runs again."""
        path, trial.restore_path = trial.restore_path, None
        if not path:
            return
        for owner in self.trials:
            if owner is not trial and any(c["path"] == path for c in owner.checkpoints):
                self._enforce_retention(owner)
                return

    def _enforce_retention(self, trial: Trial) -> None:
        keep = self.checkpoint_config.num_to_keep
        if keep is None or len(trial.checkpoints) <= keep:
            return
        attr = self.checkpoint_config.checkpoint_score_attribute
        order = self.checkpoint_config.checkpoint_score_order
        # Never delete the newest one, nor one another trial is about to clone (PBT).
        wanted = {t.restore_path for t in self.trials if t.restore_path}
        wanted |= {e.checkpoint for e in self._pending_exploit.values()}
        candidates = [c for c in trial.checkpoints
                      if c["path"] != trial.checkpoint and c["path"] not in wanted]

        def score(c: dict[str, Any]) -> float:
            if attr is None:
                return float(c["iteration"])  # keep the newest
            v = c["metrics"].get(attr)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return float("-inf")
            return float(v) if order == "max" else -float(v)

        candidates.sort(key=score)
        excess = len(trial.checkpoints) - keep
        for victim in candidates[:excess]:
            trial.checkpoints.remove(victim)
            self.storage.delete(victim["path"])

    # ------------------------------------------------------------- budget
    def _check_budget(self) -> None:
        if self.time_budget_s is None or self._stop_all:
            return
        if time.monotonic() - self._start >= self.time_budget_s:
            self._stop_everything(f"time budget of {self.time_budget_s}s reached")

    def _stop_everything(self, why: str) -> None:
        if self._stop_all:
            return
        logger.info("stopping the experiment: %s", why)
        self._stop_all = True
        for tid in self._queued:
            self.executor.unqueue(tid)
        for trial in self.trials:
            if trial.status == RUNNING:
                self._complete(trial, None)
                self._action[trial.trial_id] = _STOPPING
                self.executor.stop(trial.trial_id)
            elif trial.status in (PENDING, PAUSED) and trial.last_result:
                pass  # left PENDING/PAUSED: a restore can continue them

    # ------------------------------------------------------------- external
    def move_trials_off(self, worker: str) -> list[str]:
        """Checkpoint and restart elsewhere every trial on a retiring worker."""
        moved = []
        for tid in self.executor.running_on(worker):
            trial = self._by_id.get(tid)
            if trial is None or trial.status != RUNNING or tid in self._action:
                continue
            self._action[tid] = _REQUEUE
            self.executor.stop(tid, checkpoint=True)
            moved.append(tid)
            queued = tid
            while queued in self._behind:  # its successors must not start on this worker
                queued = self._behind[queued]
                self.executor.unqueue(queued)
        return moved
