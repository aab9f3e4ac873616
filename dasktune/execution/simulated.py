"""A simulated executor: trials as timed events on a virtual clock, no Dask, no threads.

:class:`SimulatedExecutor` implements :class:`~dasktune.execution.protocol.Executor`,
so the real driver loop, searchers, schedulers, stoppers and callbacks run unchanged
against thousands of simulated workers. Each trial is a list of
``(duration_s, metrics)`` iterations given by a ``trial_model``; ``events(timeout)``
jumps the virtual clock to the next due event at once, so a day of simulated training
costs only the driver's own CPU time (the idea of syne-tune's simulator backend).

This module is the clock and the contract; its rooms are :mod:`.sim_pool` (the workers
and placement) and :mod:`.sim_attempt` (one attempt's reports: auto fields, the ``stop``
dict, the checkpoint policy, a stop after a checkpoint). A restart continues from its
checkpoint's ``training_iteration``. Checkpoints are names only: nothing is written, and
deleting them (checkpoint retention) is harmless.

Why a simulated trial does not run through the real attempt runner
(:class:`dasktune.attempt.Attempt`), even as a function trainable that reports its model:

- The runner is a blocking loop bound to a thread (``Attempt.run`` returns when the
  trainable does; ``tune.report`` hands each result to ``emit``), while this executor
  advances thousands of attempts on one thread, one clock event at a time. Interleaving
  them would take a thread per running attempt and a hand-off per report: on the 2-core
  development VM the cheapest hand-off (two semaphores) costs 34 us of CPU (64 us wall)
  per report, against 47 us of CPU per report for the whole simulated run with the driver
  (200 trials x 100 reports on 100 workers) -- the simulator would be about twice as
  slow, and a 1,000-worker simulation would hold 1,000 threads. The runner's own work is
  small: 4.8 us per report in-thread (``Attempt.run`` on ``memory://``).
- It would be less faithful, not more: the runner's session times iterations with the
  wall clock (``time.monotonic``) and has no clock to inject, so ``time_total_s`` and
  ``timestamp`` would stop following the model (time-based schedulers and stoppers would
  see microseconds); its checkpoints and trial-end markers are written to storage.
- What the runner decides is shared instead, function by function: the auto fields
  (:func:`~dasktune.result.fill_auto_fields`), the ``stop`` dict
  (:func:`~dasktune.session.stop_dict_hit`), the checkpoint policy
  (:func:`~dasktune.attempt.checkpoint_due`) and the folder names
  (:func:`~dasktune.layout.checkpoint_dir_name`).

:func:`dasktune.simulator.run_simulated` runs an experiment on it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dasktune.execution.protocol import EventKind, ExecEvent, WorkerGang
from dasktune.execution.sim_attempt import SimAttempt, StopRequest
from dasktune.execution.sim_pool import SimPool

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["SimulatedExecutor", "TrialModel"]

STARTED, REPORTS, FINISHED = EventKind.STARTED, EventKind.REPORTS, EventKind.FINISHED
LOST, WORKER_LOST = EventKind.LOST, EventKind.WORKER_LOST
WORKER_RETIRING = EventKind.WORKER_RETIRING

#: ``trial_model(config, trial_id)`` -> one ``(duration_s, metrics)`` or
#: ``(duration_s, metrics, checkpoint)`` per iteration, for the whole trial.
TrialModel = Callable[[dict[str, Any], str], Sequence[tuple[Any, ...]]]

# Clock entry kinds.
_START, _ITER, _FINISH, _LOSE, _RETIRE = 0, 1, 2, 3, 4


class SimulatedExecutor:
    """``n_workers`` simulated workers of ``slots_per_worker`` CPUs each, on a virtual clock.

    Args:
        n_workers: how many workers (``sim://worker-0000`` ...).
        slots_per_worker: the CPUs each worker offers (a trial asks for 1 by default).
        trial_model: ``f(config, trial_id)`` -> the trial's iterations, each
            ``(duration_s, metrics)`` or ``(duration_s, metrics, checkpoint: bool)``. It is
            called at every (re)start with the trial's current config (PBT changes it);
            a restart skips the iterations its checkpoint already covers.
        seed: seeds the duration jitter (the only randomness the executor adds).
        jitter: each duration is multiplied by ``uniform(1 - jitter, 1 + jitter)``.
        start_latency_s: virtual seconds from ``start`` to the trial's STARTED event.
        resources: extra resources each worker offers, e.g. ``{"GPU": 1}``.
    """

    can_queue = False  # every start is an event on the clock: nothing to save by queueing

    def __init__(self, n_workers: int, slots_per_worker: float = 1, trial_model: TrialModel |
                 None = None, *, seed: int = 0, jitter: float = 0.0,
                 start_latency_s: float = 0.0, resources: Mapping[str, float] | None = None):
        if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 0:
            raise ValueError(f"SimulatedExecutor: n_workers must be an int >= 0, got "
                             f"{n_workers!r}")
        if not slots_per_worker > 0:
            raise ValueError(f"SimulatedExecutor: slots_per_worker must be > 0, got "
                             f"{slots_per_worker!r}")
        if trial_model is None or not callable(trial_model):
            raise TypeError(f"SimulatedExecutor: trial_model must be a callable "
                            f"f(config, trial_id) -> [(duration_s, metrics), ...], got "
                            f"{trial_model!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"SimulatedExecutor: jitter must be in [0, 1), got {jitter!r}")
        if start_latency_s < 0:
            raise ValueError(f"SimulatedExecutor: start_latency_s must be >= 0, got "
                             f"{start_latency_s!r}")
        self.trial_model = trial_model
        self.seed = seed
        self._rng = random.Random(seed)
        self._jitter = float(jitter)
        self._start_latency = float(start_latency_s)
        self._extra = {str(k): float(v) for k, v in (resources or {}).items()}
        self.now = 0.0  # virtual seconds since the start
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._counter = 0  # heap tie-break: events at one time keep their order
        self._tokens = 0
        self._runs: dict[str, SimAttempt] = {}
        self._pool = SimPool()
        # Synthetic checkpoint -> its (training_iteration, time_total_s): a restart from a
        # donor's checkpoint (PBT) finds no manifest on storage, since nothing is written.
        self._ckpt_meta: dict[str, tuple[int, float]] = {}
        self._ready: list[ExecEvent] = []  # due now, outside the heap (LOST)
        self._gangs: dict[str, tuple[str, WorkerGang]] = {}  # gang id -> (trial, gang)
        self.num_started = 0
        self.num_reports = 0
        #: Trial id -> the workers an elastic cluster would be asked for (:meth:`demand`).
        self.demanded: dict[str, int] = {}
        for i in range(n_workers):
            self.add_worker(f"sim://worker-{i:04d}", {"CPU": float(slots_per_worker),
                                                      **self._extra})

    # ------------------------------------------------------------ cluster
    def add_worker(self, addr: str, capacity: Mapping[str, float]) -> None:
        """Add a worker offering ``capacity`` (e.g. ``{"CPU": 4}``) now."""
        self._pool.add(addr, capacity)

    def kill_workers(self, addrs: Sequence[str], at: float | None = None) -> None:
        """Lose ``addrs`` at virtual time ``at`` (default: now), as a crash would."""
        when = self.now if at is None else float(at)
        for addr in addrs:
            if addr not in self._pool.workers:
                raise ValueError(f"SimulatedExecutor.kill_workers: unknown worker {addr!r}")
            self._push(when, _LOSE, addr, 0)

    def retire_workers(self, addrs: Sequence[str], at: float | None = None) -> None:
        """Retire ``addrs`` gracefully at virtual time ``at`` (default: now), as a spot
        notice or a scale-down would: each takes no new trial, the driver moves its
        trials off (after their next checkpoint, as on a Dask cluster) and it leaves
        once nothing runs there."""
        when = self.now if at is None else float(at)
        for addr in addrs:
            if addr not in self._pool.workers:
                raise ValueError(f"SimulatedExecutor.retire_workers: unknown worker {addr!r}")
            self._push(when, _RETIRE, addr, 0)

    def workers(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """Live workers and their info (the same dict each call: the driver only reads it)."""
        return self._pool.info

    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        return self._pool.can_ever_fit(resources)

    def place(self, resources: dict[str, float]) -> str | None:
        """The worker with the most free CPU that fits ``resources``, or None (O(log W))."""
        return self._pool.place(resources)

    @property
    def num_running(self) -> int:
        return len(self._runs)

    def running_on(self, addr: str) -> list[str]:
        return self._pool.running_on(addr)

    def lose_worker(self, addr: str) -> list[str]:
        """Every attempt on ``addr`` is LOST (the driver calls this on WORKER_LOST)."""
        lost = self.running_on(addr)
        for tid in lost:
            run = self._runs[tid]
            run.token = self._next_token()  # its pending iteration never arrives
            self._ready.append(ExecEvent(LOST, tid, run.spec.attempt,
                                         error=f"worker {addr} was lost"))
        self._lose_gangs_on(addr)
        return lost

    # ------------------------------------------------------------ gangs
    # A simulated trial runs no code and so never asks for a gang itself; the driver's
    # up-front reservation (a learnt or declared gang shape) is granted from the slots.
    def can_ever_fit_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                          head: dict[str, float] | None = None) -> str | None:
        return self._pool.can_ever_fit_gang(bundles, strategy, head)

    def place_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                   head: dict[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        return self._pool.place_gang(bundles, strategy, head, head_worker)

    def grant_workers(self, trial_id: str, bundles: list[dict[str, float]], strategy: str,
                      workers: list[str], request_id: str = "") -> WorkerGang:
        """Take the slots at once (a simulated trial has no request waiting for them)."""
        gang = WorkerGang(f"{trial_id}-gang-{self._next_token()}", list(workers),
                          [self._pool.host(w) for w in workers],
                          [[] for _ in workers], [dict(b) for b in bundles], strategy)
        for addr, bundle in zip(workers, bundles):
            self._pool.count(addr, bundle)
        self._gangs[gang.gang_id] = (trial_id, gang)
        return gang

    def refuse_workers(self, trial_id: str, request_id: str, why: str) -> None:
        pass  # no simulated trial asks

    def release_gang(self, gang_id: str) -> None:
        held = self._gangs.pop(gang_id, None)
        if held is not None:
            for addr, bundle in zip(held[1].workers, held[1].bundles):
                self._pool.count(addr, bundle, -1.0)

    def _lose_gangs_on(self, addr: str) -> None:
        for gang_id, (tid, gang) in list(self._gangs.items()):
            if addr in gang.workers:
                self.release_gang(gang_id)
                run = self._runs.get(tid)
                if run is not None:
                    self._ready.append(ExecEvent(EventKind.GANG_LOST, tid, run.spec.attempt,
                                                 worker=addr, gang_id=gang_id))

    def retire_when_free(self, addr: str) -> bool:
        held = any(addr in gang.workers for _tid, gang in self._gangs.values())
        if addr not in self._pool.retiring or self.running_on(addr) or held:
            return False
        self._pool.remove(addr)
        return True

    # ------------------------------------------------------------ control
    def start(self, spec: TrialSpec, resources: dict[str, float], worker: str,
              params: dict[str, Any] | None = None) -> None:
        """Start an attempt of ``spec`` on ``worker`` (chosen by :meth:`place`)."""
        if spec.trial_id in self._runs:
            raise RuntimeError(f"trial {spec.trial_id} is already running")
        if not self._pool.is_live(worker):
            raise ValueError(f"SimulatedExecutor.start: unknown or lost worker {worker!r}")
        steps = self.trial_model(spec.config, spec.trial_id)
        if not isinstance(steps, Sequence):
            raise TypeError(f"trial_model must return a list of (duration_s, metrics), got "
                            f"{type(steps).__name__} for trial {spec.trial_id}")
        meta = spec.restore_meta or {}
        iteration, total = int(meta.get("training_iteration", 0)), \
            float(meta.get("time_total_s", 0.0))
        if spec.restore_path and not meta and spec.restore_path in self._ckpt_meta:
            iteration, total = self._ckpt_meta[spec.restore_path]
        run = SimAttempt(spec=spec, worker=worker, resources=dict(resources), steps=steps,
                         pos=min(iteration, len(steps)), token=self._next_token(),
                         checkpoints=self._ckpt_meta, iteration=iteration, time_total=total,
                         ckpt_index=spec.next_checkpoint_index)
        self._runs[spec.trial_id] = run
        self._pool.hold(worker, spec.trial_id, run.resources)
        self.num_started += 1
        self._push(self.now + self._start_latency, _START, spec.trial_id, run.token)

    def stop(self, trial_id: str, checkpoint: bool = False) -> None:
        """End an attempt: now, or after the iteration in flight and a checkpoint."""
        run = self._runs.get(trial_id)
        if run is None or run.stop == StopRequest.NOW:
            return
        if checkpoint:
            run.stop = run.stop or StopRequest.AFTER_CHECKPOINT
            return
        run.stop = StopRequest.NOW
        if run.started:
            run.token = self._next_token()  # drop the iteration in flight
            self._push(self.now, _FINISH, trial_id, run.token)

    def checkpoint(self, trial_id: str) -> None:
        """Checkpoint after the iteration in flight (a Callback's ``SHOULD_CHECKPOINT``)."""
        run = self._runs.get(trial_id)
        if run is not None:
            run.want_checkpoint = True

    def release(self, trial_id: str) -> None:
        """Forget an attempt and free its resources."""
        run = self._runs.pop(trial_id, None)
        if run is None:
            return
        run.token = -1
        for gang_id, (tid, _gang) in list(self._gangs.items()):
            if tid == trial_id:
                self.release_gang(gang_id)
        self._pool.free(run.worker, trial_id, run.resources)

    # A simulated cluster has a fixed size (add_worker is the test's to call): there is
    # no scheduler to show waiting trials to; ``demanded`` keeps what one would be shown.
    def demand(self, trial_id: str, resources: dict[str, float],
               bundles: list[dict[str, float]] | None = None, strategy: str = "PACK") -> None:
        """Note the workers ``trial_id`` (and its gang) lack now in :attr:`demanded`."""
        if bundles:
            run = self._runs.get(trial_id)
            self.demanded[trial_id] = self._pool.gang_shortfall(
                bundles, strategy, resources, run.worker if run is not None else None)[0]
        elif trial_id not in self._runs:
            self.demanded[trial_id] = 0 if self._pool.place(resources) else 1

    def withdraw(self, trial_id: str) -> None:
        self.demanded.pop(trial_id, None)

    def queue_after(self, running_id: str, spec: TrialSpec) -> bool:
        return False

    def unqueue(self, trial_id: str) -> None:
        pass

    def shutdown(self) -> None:
        for tid in list(self._runs):
            self.release(tid)
        self._heap.clear()

    # ------------------------------------------------------------ clock
    def _next_token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _push(self, when: float, kind: int, key: str, token: int) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (when, self._counter, kind, key, token))

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event due at the next event time, advancing the virtual clock to it.

        ``timeout`` is ignored: nothing can happen between now and the next event.
        """
        if self._ready:  # due now (a lost worker's attempts): the clock stays
            out, self._ready = self._ready, []
            return out
        out: list[ExecEvent] = []
        heap = self._heap
        first: float | None = None
        while heap:
            when = heap[0][0]
            if first is not None and when > first:
                break
            _when, _n, kind, key, token = heapq.heappop(heap)
            if kind == _LOSE:
                if key in self._pool.gone:
                    continue
                self._pool.remove(key)
                ev = ExecEvent(WORKER_LOST, worker=key)
            elif kind == _RETIRE:
                if key in self._pool.gone or key in self._pool.retiring:
                    continue
                self._pool.retiring.add(key)
                ev = ExecEvent(WORKER_RETIRING, worker=key)
            else:
                run = self._runs.get(key)
                if run is None or run.token != token:
                    continue  # stale: stopped, lost or released meanwhile
                # The clock is at the event before the attempt moves: its result's
                # timestamp and its next iteration count from here.
                self.now = max(self.now, when)
                ev = self._advance(run, kind)
            first = when if first is None else first
            self.now = max(self.now, when)
            out.append(ev)
        if not out and self._runs:
            stuck = sorted(self._runs)[:5]
            raise RuntimeError(f"SimulatedExecutor: {len(self._runs)} attempts are running but "
                               f"none has an event due (e.g. {stuck}); a FINISHED/LOST "
                               "attempt was not released")
        return out

    def _advance(self, run: SimAttempt, kind: int) -> ExecEvent:
        tid, attempt = run.spec.trial_id, run.spec.attempt
        if kind == _FINISH:
            run.token = self._next_token()
            return ExecEvent(FINISHED, tid, attempt)
        if kind == _START:
            run.started = True
            if run.stop == StopRequest.NOW:
                self._push(self.now, _FINISH, tid, run.token)
            else:
                self._schedule_iteration(run)
            return ExecEvent(STARTED, tid, attempt, worker=run.worker,
                             host=self._pool.host(run.worker))
        # _ITER: the iteration in flight has completed.
        ended, reports, error = run.complete_iteration(self.now, self._pool.host(run.worker))
        self.num_reports += sum(1 for r in reports if r.result is not None)
        if ended is FINISHED:
            run.token = self._next_token()
            return ExecEvent(FINISHED, tid, attempt, reports=reports, error=error)
        self._schedule_iteration(run)
        return ExecEvent(REPORTS, tid, attempt, reports=reports)

    def _schedule_iteration(self, run: SimAttempt) -> None:
        d = run.next_duration()
        if d is None:  # nothing (left) to run: it returns at once
            self._push(self.now, _FINISH, run.spec.trial_id, run.token)
            return
        if self._jitter:  # drawn in scheduling order, which the seed makes reproducible
            d *= self._rng.uniform(1 - self._jitter, 1 + self._jitter)
        run.duration = d
        self._push(self.now + d, _ITER, run.spec.trial_id, run.token)
