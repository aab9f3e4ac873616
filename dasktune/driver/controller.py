"""The driver loop: asks search for trials, applies scheduler decisions, talks to one executor.

One thread, no Dask: the executor is any :class:`~dasktune.execution.Executor`. Each
pass: fill free slots (``scheduler.choose_trial_to_run``, else a new suggestion from
search), take the executor's events, and route each report through loggers, searcher,
scheduler and stopper, in report order. The rooms around it: the checkpoint book, the
failure policy, the queue-ahead lines, the trial index and the state saves, each in its
own module of :mod:`dasktune.driver`; the typed verdicts in :mod:`.decisions`.

Reports carry the attempt that made them; one from an attempt that is not the trial's
current one (a zombie after a partition, or a stopped attempt's tail) is dropped. After
a restart, iterations already logged are not logged again.

Over ~400 lines (about 490) because the pass itself stays in one place: choosing and
starting trials, with their gang reservations (:mod:`.gang_queue` decides which request
goes first, but starting a trial and its gang must be one step of the loop), and winding
down; what each event does to a trial is :mod:`.trial_events`'.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from dasktune import _dask_config
from dasktune.callback import Callback, CallbackList
from dasktune.driver.checkpoint_book import CheckpointBook
from dasktune.driver.decisions import EndedBy, Winding
from dasktune.driver.failure_policy import FailurePolicy
from dasktune.driver.gang_queue import GangQueue, note_gang
from dasktune.driver.queue_ahead import QueueLines
from dasktune.driver.state_saves import StateSaves
from dasktune.driver.trial_events import TrialEvents
from dasktune.driver.trial_index import TrialIndex
from dasktune.error_log import ErrorFileLogger
from dasktune.execution import EventKind
from dasktune.resources import worker_capacity
from dasktune.schedulers import FIFOScheduler, Reconfigure, TrialScheduler
from dasktune.session import TrialSpec
from dasktune.shipping import dumps_trainable
from dasktune.trial import PAUSED, PENDING, RUNNING, TERMINATED, Placement, Trial

if TYPE_CHECKING:
    from concurrent.futures import Future

    from dasktune.driver.plan import ExperimentPlan
    from dasktune.driver.restore import Restoration
    from dasktune.execution import Executor
    from dasktune.search import SearchAlgorithm
    from dasktune.storage import ExperimentStorage

__all__ = ["TuneController"]

logger = logging.getLogger(__name__)


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

    def worker_resources(self) -> dict[str, dict[str, float]]:
        """What each live worker offers, busy or not (``ResourceChangingScheduler`` shares
        it out: a trial runs on one worker)."""
        return {addr: worker_capacity(w) for addr, w in self._c.executor.workers().items()}

    @property
    def _resource_updater(self) -> _ResourceUpdater:
        """Ray's ``tune_controller._resource_updater``, which resource allocation functions
        (Ray's xgboost_dynamic_resources_example) ask for the cluster's CPUs and GPUs."""
        return _ResourceUpdater(self)


class _ResourceUpdater:
    """The cluster's CPU and GPU totals under Ray's names."""

    def __init__(self, ctx: _Context):
        self._ctx = ctx

    def _total(self, key: str) -> float:
        return sum(cap.get(key, 0.0) for cap in self._ctx.worker_resources().values())

    def get_num_cpus(self) -> float:
        return self._total("CPU")

    def get_num_gpus(self) -> float:
        return self._total("GPU")


class TuneController(TrialEvents):
    """Runs one experiment to the end on an executor.

    Args:
        plan: what to run (trainable, storage, configs, stopper, resources).
        search_alg: suggests trials.
        scheduler: decides, from results, what becomes of running trials.
        executor: runs the attempts.
        callbacks: told of everything (loggers, dashboard, the user's).
        trials: trials of a restored experiment.
        restoration: what a restore found in storage beyond the saved state (see
            :mod:`.restore`), carried out before the first trial starts.
        save_state: writes the experiment state (``save_state(controller, wait=...)``).
        reporter: the console's progress reporter.
    """

    def __init__(self, plan: ExperimentPlan, search_alg: SearchAlgorithm,
                 scheduler: TrialScheduler, executor: Executor, callbacks: list[Callback],
                 *, trials: list[Trial] | None = None, save_state: Any = None,
                 reporter: Any = None, restoration: Restoration | None = None):
        self.plan = plan
        tc = plan.tune_config
        self.trainable = plan.trainable
        # Pickled here, once, with cloudpickle: Dask would send an importable function by
        # reference, which fails on workers that cannot import the user's module.
        self._trainable_blob = dumps_trainable(plan.trainable)
        self.storage: ExperimentStorage = plan.storage
        self.search_alg = search_alg
        self.scheduler = scheduler
        self.executor = executor
        # First, as Ray writes error.txt before any callback hears of the failure.
        self._error_log = ErrorFileLogger()
        self.callbacks = CallbackList([self._error_log, *callbacks])
        self.stopper = plan.stopper
        self.metric, self.mode = tc.metric, tc.mode
        self.index = TrialIndex(list(trials or []))
        self.trials = self.index.trials
        self._by_id = self.index.by_id
        self._restoration = restoration
        self._save_state = save_state
        self.saves = StateSaves(None if save_state is None else self._write_state)
        self.book = CheckpointBook(plan.storage, plan.checkpoint_config, self.trials,
                                   self.callbacks, lambda: self._iteration)
        self.failures = FailurePolicy(plan.failure_config)
        self._reporter = reporter
        self._ctx = _Context(self)
        self._winding: dict[str, Winding] = {}
        self._reconfigure: dict[str, Reconfigure] = {}  # of trials pausing to change
        self._iteration = 0
        self._start = time.monotonic()
        self._warned_on_demand = False
        self._stop_all = False
        self._raise: BaseException | None = None
        self._waiting_reason: str | None = None
        self._waiting_trial: Trial | None = None  # the trial _waiting_reason is about
        self._retiring: set[str] = set()
        self._no_workers_since: float | None = None
        self._no_workers_timeout = _dask_config.get_seconds("executor.no-workers-timeout")
        self.num_reports = 0
        fifo = type(scheduler) is FIFOScheduler
        suggests_ahead = bool(getattr(search_alg, "suggests_ahead", False))
        # A scheduler that decides per result (ASHA, HyperBand, PBT, ...) gets results
        # one at a time: report() waits for the driver to receive each, so a decision
        # lands at most one iteration late. FIFO runs unthrottled.
        self._sync_reports = bool(_dask_config.get("executor.sync-reports")) or not fifo
        # Trials that ask for gangs of workers, and the experiment's gang shape.
        self.gangs = GangQueue(executor, plan.gang_shape, can_scale=plan.can_scale)
        # Queue-ahead lines only where asking the searcher early costs nothing and the
        # FIFO scheduler's choice is "the next trial"; an elastic cluster should grow
        # for a waiting trial instead. Not for gang trials: a queued attempt would start
        # with no gang reserved.
        self._queue_next = bool(_dask_config.get("executor.queue-next")) and fifo and \
            not plan.can_scale and suggests_ahead and executor.can_queue and \
            plan.gang_shape is None
        self.lines = QueueLines(executor, self._by_id, lambda tid: tid in self._winding,
                                self._successor_candidate, self._spec_for,
                                self._no_longer_waiting)
        # A scheduler that picks which waiting trial runs next (PBT, HyperBand, median
        # stopping) must see the population, not only the trials that had a free slot:
        # with a searcher that suggests ahead, keep up to this many trials PENDING, as
        # Ray does (TUNE_MAX_PENDING_TRIALS_PG, 16 or more).
        self._scheduler_chooses = \
            type(scheduler).choose_trial_to_run is not TrialScheduler.choose_trial_to_run
        self._max_pending = int(_dask_config.get("controller.max-pending-trials")) if \
            self._scheduler_chooses and suggests_ahead else 0

    # ------------------------------------------------------------------ loop
    def run(self) -> list[Trial]:
        self.callbacks.setup(stop=self.plan.stop_dict, num_samples=None,
                             total_num_samples=self.search_alg.total_samples,
                             storage=self.storage, controller=self)
        for trial in self.trials:
            if trial.status == PENDING:
                self.scheduler.on_trial_add(self._ctx, trial)
        if self._restoration is not None:
            self._restoration.carry_out(
                trials=self.trials, callbacks=self.callbacks, book=self.book,
                scheduler=self.scheduler, search_alg=self.search_alg, context=self._ctx,
                save=lambda: self.save(wait=True))
            self.saves.dirty = True
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
        if self.index.count(PENDING) or self.index.count(PAUSED):
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
            if event.kind is not EventKind.REPORTS:
                # A slot may have freed: refill it now, not after the rest of a long
                # queue of reports from other trials.
                self._fill_slots()
        for trial in self.scheduler.trials_to_stop(self._ctx):
            if trial.status in (PENDING, PAUSED):
                self._complete(trial, trial.last_result, EndedBy.SCHEDULER)
        self._check_budget()
        self.callbacks.on_step_end(iteration=self._iteration, trials=self.trials)
        now = time.monotonic()
        self.saves.maybe_save(now)
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
        if self._restoration is not None and self.search_alg.is_finished():
            self._restoration.drop_unadopted()
        close = getattr(self.search_alg, "close", None)
        if close is not None:
            close()
        self._error_log.write_pending()  # before the state is saved: its error_file
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

    def save(self, wait: bool = False) -> None:
        """Save the experiment state (``wait``: written before this returns)."""
        self.saves.save(wait)

    def _write_state(self, wait: bool) -> Future[float] | None:
        return self._save_state(self, wait=wait)

    def _set_status(self, trial: Trial, status: str) -> None:
        self.index.set_status(trial, status)

    # ------------------------------------------------------------- starting
    def _fill_slots(self) -> int:
        started = 0
        if self._stop_all:
            return 0
        while self.index.count(PENDING) < self._max_pending and \
                not self.search_alg.is_finished() and self._new_trial():
            pass
        if self.gangs.waiting and self.gangs.grant_waiting():
            return 0  # first come, first served: no new trial takes what a gang waits for
        limit = self.plan.tune_config.max_concurrent_trials
        while limit is None or self.executor.num_running < limit:
            trial = self._choose_trial_to_run()
            if trial is None:
                if self.lines.queued:
                    if self.search_alg.is_finished() or not self._new_trial():
                        # A free slot and no new trial: use it for a queued one.
                        self.lines.take_back_one(
                            lambda t: self.executor.place(t.resources) is not None)
                        break
                    continue
                if self.index.count(PENDING) or self.search_alg.is_finished():
                    break
                if not self._new_trial():
                    break
                continue
            if not self._try_start(trial):
                break
            started += 1
        if self._queue_next and self.lines.need_next:
            self.lines.fill()
        return started

    def _choose_trial_to_run(self) -> Trial | None:
        if self._scheduler_chooses:
            return self.scheduler.choose_trial_to_run(self._ctx)
        # The base class's choice (the first PENDING trial, else the first PAUSED one)
        # from the index, minus the queued trials (queued only under FIFO).
        queued = self.lines.queued
        return self.index.first(PENDING, queued) or self.index.first(PAUSED, queued)

    def _successor_candidate(self) -> Trial | None:
        """The trial to queue next: the one that waits for a slot if it never ran, else
        a new one."""
        waiting = self._waiting_trial
        if waiting is not None and self.lines.is_fresh(waiting):
            return waiting
        if self._stop_all or self.search_alg.is_finished() or not self._new_trial():
            return None
        trial = self.trials[-1]
        # (Not one adopted as finished: see _adopt.)
        return trial if trial.status == PENDING and trial.trial_id not in self.lines.queued \
            else None

    def _no_longer_waiting(self, trial: Trial) -> None:
        if self._waiting_trial is trial:
            self._waiting_reason = self._waiting_trial = None

    def _new_trial(self) -> bool:
        suggestion = self.search_alg.next_trial()
        if suggestion is None:
            return False
        trial = Trial(trial_id=suggestion.trial_id, config=suggestion.config,
                      experiment_tag=suggestion.experiment_tag,
                      trainable_name=self.plan.trainable_name)
        trial.resources = self.plan.resources_for(trial.config)
        trial.evaluated_params = getattr(suggestion, "evaluated_params", None) or {}
        if self.plan.name_trial is not None:
            self.plan.name_trial(trial)
        dirname = trial.custom_dirname or f"{self.plan.trainable_name}_{trial.dirname}"
        trial.path = self.storage.trial_path(dirname)
        self.index.add(trial)
        self.scheduler.on_trial_add(self._ctx, trial)
        self.saves.dirty = True
        self._adopt(trial)
        return True

    def _adopt(self, trial: Trial) -> None:
        """A restored run's new trial that the killed driver had made and finished after
        its last save is TERMINATED with its record, never run again (see :mod:`.restore`)."""
        rec = self._restoration.adopt(trial) if self._restoration is not None else None
        if rec is None:
            return
        logger.info("trial %s finished before the driver was killed: not run again",
                    trial.trial_id)
        self._set_status(trial, TERMINATED)
        self._restoration.carry_out_adopted(  # type: ignore[union-attr]
            rec, trials=self.trials, callbacks=self.callbacks, book=self.book,
            scheduler=self.scheduler, search_alg=self.search_alg, context=self._ctx,
            iteration=self._iteration)
        self.saves.soon()

    def _try_start(self, trial: Trial) -> bool:
        group = None
        if self.gangs.shape is not None:  # the trial with its gang, all or none
            group = self.gangs.place(trial)
            worker = group[0] if group else None
        else:
            worker = self.executor.place(trial.resources)
        if worker is None:
            self._cannot_place(trial)
            return False
        self._waiting_reason = None
        self._waiting_trial = None
        self._no_workers_since = None
        was_paused = trial.status == PAUSED
        spec = self._spec_for(trial)
        # A restart continues the iteration count of its checkpoint, or restarts at 0.
        self._set_status(trial, RUNNING)
        if group is not None:
            spec.gang = self.gangs.start_group(trial, group[1:])
        self.executor.start(spec, trial.resources, worker, self.plan.params)
        host = self.executor.workers().get(worker, {}).get("host", "")
        trial.placements.append(Placement(attempt=trial.attempt, worker=worker, host=host,
                                          start=time.time()))
        note_gang(trial, spec.gang)
        if was_paused:
            hook = getattr(self.search_alg, "on_trial_unpause", None)
            if hook is not None:
                hook(trial.trial_id)
        self.saves.dirty = True
        return True

    def _cannot_place(self, trial: Trial) -> None:
        """No worker can take ``trial`` now: say why, show an elastic cluster the demand,
        and give up (an error) if it can never be placed or no worker comes."""
        can_scale = self.plan.can_scale
        why = self.executor.can_ever_fit(trial.resources) if self.gangs.shape is None \
            else self.gangs.never_fits(trial)
        if why is not None and not can_scale:
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
        if can_scale:
            # Adaptive sizes the cluster from the scheduler's view: show it this trial,
            # with its gang if it has one. (Withdrawn when it starts, in
            # executor.start, or ends: _complete/_error.)
            shape = self.gangs.shape
            if shape is None:
                self.executor.demand(trial.trial_id, trial.resources)
            else:
                self.executor.demand(trial.trial_id, trial.resources, shape.bundles,
                                     shape.strategy)
        self._waiting_reason = why or "all workers busy"
        self._waiting_trial = trial

    def _spec_for(self, trial: Trial) -> TrialSpec:
        """The trial's next attempt, as its actor gets it."""
        trial.attempt += 1
        restore, meta = self.book.restore_for(trial)
        cc = self.plan.checkpoint_config
        return TrialSpec(
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
            stop=self.plan.stop_dict,
            checkpoint_frequency=cc.checkpoint_frequency,
            checkpoint_at_end=bool(cc.checkpoint_at_end),
            next_checkpoint_index=self.book.next_index(trial),
            experiment_tag=trial.experiment_tag,
            max_buffered=int(_dask_config.get("executor.max-buffered-reports")),
            sync_reports=self._sync_reports,
            isolate=bool(_dask_config.get("executor.isolate")),
            reuse_instance=bool(self.plan.tune_config.reuse_actors),
        )

    # ------------------------------------------------------------- budget
    def _check_budget(self) -> None:
        budget = self.plan.tune_config.time_budget_s
        if budget is None or self._stop_all:
            return
        if time.monotonic() - self._start >= budget:
            self._stop_everything(f"time budget of {budget}s reached")

    def _stop_everything(self, why: str) -> None:
        """End the experiment: running trials end; waiting ones stay resumable."""
        if self._stop_all:
            return
        logger.info("stopping the experiment: %s", why)
        self._stop_all = True
        self.lines.unqueue_all()
        for trial in self.trials:
            if trial.status == RUNNING:
                self._complete(trial, None, EndedBy.EXPERIMENT, f"stopped: {why}")
                self._wind_down(trial, Winding.STOPPING)
