"""A simulated executor: trials as timed events on a virtual clock, no Dask, no threads.

:class:`SimulatedExecutor` implements :class:`~dasktune.execution.protocol.Executor`,
so the real driver loop, searchers, schedulers, stoppers and callbacks run unchanged
against thousands of simulated workers. Each trial is a list of
``(duration_s, metrics)`` iterations given by a ``trial_model``; ``events(timeout)``
jumps the virtual clock to the next due event at once, so a day of simulated training
costs only the driver's own CPU time (the idea of syne-tune's simulator backend).

A simulated trial has no code to run: its reports come from the model. It fills the
auto fields of each result, applies the ``stop`` dict (:func:`~dasktune.session.stop_dict_hit`)
and checkpoints when the runner's policy says (:func:`~dasktune.attempt.checkpoint_due`:
every ``checkpoint_frequency`` iterations, at the end with ``checkpoint_at_end``), when
the model or a Callback asks, and on ``stop(checkpoint=True)`` (after the iteration in
flight, as a class trainable does: a checkpoint-only report, then FINISHED); a restart
continues from its checkpoint's ``training_iteration``. Checkpoints are names only: nothing is
written, and deleting them (checkpoint retention) is harmless.

:func:`dasktune.simulator.run_simulated` runs an experiment on it.

Over ~400 lines because it is a whole executor: placement over thousands of workers (a
heap by free CPU, gangs), the event clock, and each trial's reports, which all share ``_SimRun``.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune.attempt import checkpoint_due
from dasktune.execution.gang_placement import place_group
from dasktune.execution.protocol import EventKind, ExecEvent, Report, WorkerGang
from dasktune.layout import checkpoint_dir_name
from dasktune.result import fill_auto_fields
from dasktune.session import stop_dict_hit

if TYPE_CHECKING:
    from dasktune.session import TrialSpec

__all__ = ["SimulatedExecutor", "TrialModel"]

STARTED, REPORTS, FINISHED = EventKind.STARTED, EventKind.REPORTS, EventKind.FINISHED
LOST, WORKER_LOST = EventKind.LOST, EventKind.WORKER_LOST

#: ``trial_model(config, trial_id)`` -> one ``(duration_s, metrics)`` or
#: ``(duration_s, metrics, checkpoint)`` per iteration, for the whole trial.
TrialModel = Callable[[dict[str, Any], str], Sequence[tuple[Any, ...]]]

_EPOCH = 1_700_000_000.0  # virtual time 0 as a wall-clock timestamp (fixed: reproducible)
_NOW, _CKPT = "now", "checkpoint"

# Heap entry kinds.
_START, _ITER, _FINISH, _LOSE = 0, 1, 2, 3


@dataclass
class _SimRun:
    spec: TrialSpec
    worker: str
    resources: dict[str, float]
    steps: Sequence[tuple[Any, ...]]
    pos: int  # index of the next step to run
    token: int  # heap entries with another token are stale
    iteration: int = 0
    time_total: float = 0.0
    since_restore: int = 0
    time_since_restore: float = 0.0
    ckpt_index: int = 0
    started: bool = False
    stop: str | None = None  # None, _NOW or _CKPT
    seq: int = 0
    duration: float = 0.0  # of the iteration in flight
    want_checkpoint: bool = False  # asked for by the driver (SHOULD_CHECKPOINT)


@dataclass
class _Worker:
    capacity: dict[str, float]
    free: dict[str, float] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)


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
        self._runs: dict[str, _SimRun] = {}
        self._workers: dict[str, _Worker] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()
        self._retiring: set[str] = set()
        # Most free CPU first (ties: lowest address, as DaskExecutor.place); lazy entries.
        self._by_free: list[tuple[float, str]] = []
        # Synthetic checkpoint -> its (training_iteration, time_total_s): a restart from a
        # donor's checkpoint (PBT) finds no manifest on storage, since nothing is written.
        self._ckpt_meta: dict[str, tuple[int, float]] = {}
        self._ready: list[ExecEvent] = []  # due now, outside the heap (LOST)
        self._gangs: dict[str, tuple[str, WorkerGang]] = {}  # gang id -> (trial, gang)
        self.num_started = 0
        self.num_reports = 0
        for i in range(n_workers):
            self.add_worker(f"sim://worker-{i:04d}", {"CPU": float(slots_per_worker),
                                                      **self._extra})

    # ------------------------------------------------------------ cluster
    def add_worker(self, addr: str, capacity: Mapping[str, float]) -> None:
        """Add a worker offering ``capacity`` (e.g. ``{"CPU": 4}``) now."""
        cap = {str(k): float(v) for k, v in capacity.items()}
        self._workers[addr] = _Worker(capacity=cap, free=dict(cap))
        host = addr.split("://", 1)[-1]
        self._info[addr] = {"host": host, "resources": cap, "nthreads": int(cap.get("CPU", 1))}
        self._gone.discard(addr)
        heapq.heappush(self._by_free, (-cap.get("CPU", 0.0), addr))

    def kill_workers(self, addrs: Sequence[str], at: float | None = None) -> None:
        """Lose ``addrs`` at virtual time ``at`` (default: now), as a crash would."""
        when = self.now if at is None else float(at)
        for addr in addrs:
            if addr not in self._workers:
                raise ValueError(f"SimulatedExecutor.kill_workers: unknown worker {addr!r}")
            self._push(when, _LOSE, addr, 0)

    def workers(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """Live workers and their info (the same dict each call: the driver only reads it)."""
        return self._info

    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        if not self._workers:
            return None
        for w in self._workers.values():
            if all(w.capacity.get(k, 0.0) >= v for k, v in resources.items() if v > 0):
                return None
        return f"no simulated worker offers {resources}"

    def _fits(self, w: _Worker, resources: dict[str, float]) -> bool:
        free = w.free
        return all(free.get(k, 0.0) >= v - 1e-9 for k, v in resources.items() if v > 0)

    def place(self, resources: dict[str, float]) -> str | None:
        """The worker with the most free CPU that fits ``resources``, or None (O(log W))."""
        heap = self._by_free
        skipped: list[tuple[float, str]] = []
        found = None
        while heap:
            neg, addr = heap[0]
            w = self._workers.get(addr)
            if w is None or addr in self._gone or -neg != w.free.get("CPU", 0.0):
                heapq.heappop(heap)  # stale: its free CPU changed since it was pushed
                continue
            if addr not in self._retiring and self._fits(w, resources):
                found = addr
                break
            if resources.get("CPU", 0.0) <= w.free.get("CPU", 0.0) and len(skipped) < 64:
                # Fits on CPU but not on another resource: look further down.
                skipped.append(heapq.heappop(heap))
                continue
            break  # the most free CPU is too little: nothing fits
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def _take(self, addr: str, resources: dict[str, float], sign: float) -> None:
        w = self._workers.get(addr)
        if w is None:
            return
        for k, v in resources.items():
            w.free[k] = w.free.get(k, 0.0) - sign * v
        heapq.heappush(self._by_free, (-w.free.get("CPU", 0.0), addr))
        if len(self._by_free) > 4 * len(self._workers) + 64:
            # Stale entries of full workers never reach the top: rebuild, or the heap
            # would grow with every start.
            self._by_free = [(-x.free.get("CPU", 0.0), a) for a, x in self._workers.items()
                             if a not in self._gone]
            heapq.heapify(self._by_free)

    @property
    def num_running(self) -> int:
        return len(self._runs)

    def running_on(self, addr: str) -> list[str]:
        w = self._workers.get(addr)
        return sorted(w.running) if w is not None else []

    def lose_worker(self, addr: str) -> list[str]:
        """Every attempt on ``addr`` is LOST (the driver calls this on WORKER_LOST)."""
        lost = self.running_on(addr)
        for tid in lost:
            run = self._runs[tid]
            run.token = self._next_token()  # its pending iteration never arrives
            self._emit_now(ExecEvent(LOST, tid, run.spec.attempt,
                                     error=f"worker {addr} was lost"))
        self._lose_gangs_on(addr)
        return lost

    # ------------------------------------------------------------ gangs
    # A simulated trial runs no code and so never asks for a gang itself; the driver's
    # up-front reservation (a learnt or declared gang shape) is granted from the slots.
    def _free_map(self, idle: bool = False) -> dict[str, dict[str, float]]:
        return {a: dict(w.capacity if idle else w.free) for a, w in self._workers.items()
                if a not in self._gone and (idle or a not in self._retiring)}

    def can_ever_fit_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                          head: dict[str, float] | None = None) -> str | None:
        free = self._free_map(idle=True)
        if not free or place_group(bundles, strategy, free, self._hosts(free), head, None,
                                   None) is not None:
            return None
        return f"no {len(bundles)} distinct simulated workers offer {bundles} ({strategy})"

    def place_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                   head: dict[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        free = self._free_map()
        return place_group(bundles, strategy, free, self._hosts(free), head, head_worker, None)

    def _hosts(self, free: Mapping[str, Any]) -> dict[str, str]:
        return {a: str(self._info.get(a, {}).get("host", a)) for a in free}

    def grant_workers(self, trial_id: str, bundles: list[dict[str, float]], strategy: str,
                      workers: list[str], request_id: str = "") -> WorkerGang:
        """Take the slots at once (a simulated trial has no request waiting for them)."""
        self._tokens += 1
        gang = WorkerGang(f"{trial_id}-gang-{self._tokens}", list(workers),
                          [str(self._info.get(w, {}).get("host", "")) for w in workers],
                          [[] for _ in workers], [dict(b) for b in bundles], strategy)
        for addr, bundle in zip(workers, bundles):
            self._take(addr, bundle, 1.0)
        self._gangs[gang.gang_id] = (trial_id, gang)
        return gang

    def refuse_workers(self, trial_id: str, request_id: str, why: str) -> None:
        pass  # no simulated trial asks

    def release_gang(self, gang_id: str) -> None:
        held = self._gangs.pop(gang_id, None)
        if held is not None:
            for addr, bundle in zip(held[1].workers, held[1].bundles):
                self._take(addr, bundle, -1.0)

    def _lose_gangs_on(self, addr: str) -> None:
        for gang_id, (tid, gang) in list(self._gangs.items()):
            if addr in gang.workers:
                self.release_gang(gang_id)
                run = self._runs.get(tid)
                if run is not None:
                    self._emit_now(ExecEvent(EventKind.GANG_LOST, tid, run.spec.attempt,
                                             worker=addr, gang_id=gang_id))

    def retire_when_free(self, addr: str) -> bool:
        if addr not in self._retiring or self.running_on(addr):
            return False
        self._remove_worker(addr)
        return True

    def _remove_worker(self, addr: str) -> None:
        self._gone.add(addr)
        self._info.pop(addr, None)
        self._retiring.discard(addr)

    # ------------------------------------------------------------ control
    def start(self, spec: TrialSpec, resources: dict[str, float], worker: str,
              params: dict[str, Any] | None = None) -> None:
        """Start an attempt of ``spec`` on ``worker`` (chosen by :meth:`place`)."""
        if spec.trial_id in self._runs:
            raise RuntimeError(f"trial {spec.trial_id} is already running")
        if worker not in self._workers or worker in self._gone:
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
        run = _SimRun(spec=spec, worker=worker, resources=dict(resources), steps=steps,
                      pos=min(iteration, len(steps)), token=self._next_token(),
                      iteration=iteration, time_total=total,
                      ckpt_index=spec.next_checkpoint_index)
        self._runs[spec.trial_id] = run
        self._workers[worker].running.add(spec.trial_id)
        self._take(worker, resources, 1.0)
        self.num_started += 1
        self._push(self.now + self._start_latency, _START, spec.trial_id, run.token)

    def stop(self, trial_id: str, checkpoint: bool = False) -> None:
        """End an attempt: now, or after the iteration in flight and a checkpoint."""
        run = self._runs.get(trial_id)
        if run is None or run.stop == _NOW:
            return
        if checkpoint:
            run.stop = run.stop or _CKPT
            return
        run.stop = _NOW
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
        w = self._workers.get(run.worker)
        if w is not None:
            w.running.discard(trial_id)
        self._take(run.worker, run.resources, -1.0)

    # A simulated cluster has a fixed size (add_worker is the test's to call): there is
    # no scheduler to show waiting trials to.
    def demand(self, trial_id: str, resources: dict[str, float]) -> None:
        pass

    def withdraw(self, trial_id: str) -> None:
        pass

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

    def _emit_now(self, event: ExecEvent) -> None:
        self._ready.append(event)

    def events(self, timeout: float) -> list[ExecEvent]:
        """Every event due at the next event time, advancing the virtual clock to it.

        ``timeout`` is ignored: nothing can happen between now and the next event.
        """
        out, self._ready = self._ready, []
        heap = self._heap
        first: float | None = None
        while heap:
            when = heap[0][0]
            if first is not None and when > first:
                break
            _when, _n, kind, key, token = heapq.heappop(heap)
            if kind == _LOSE:
                if key in self._gone:
                    continue
                self._remove_worker(key)
                ev = ExecEvent(WORKER_LOST, worker=key)
            else:
                run = self._runs.get(key)
                if run is None or run.token != token:
                    continue  # stale: stopped, lost or released meanwhile
                ev = self._advance(run, kind)
                if ev is None:
                    continue
            first = when if first is None else first
            self.now = max(self.now, when)
            out.append(ev)
        if not out and self._runs:
            stuck = sorted(self._runs)[:5]
            raise RuntimeError(f"SimulatedExecutor: {len(self._runs)} attempts are running but "
                               f"none has an event due (e.g. {stuck}); a FINISHED/LOST "
                               "attempt was not released")
        return out

    def _advance(self, run: _SimRun, kind: int) -> ExecEvent | None:
        spec = run.spec
        tid, attempt = spec.trial_id, spec.attempt
        if kind == _FINISH:
            run.token = self._next_token()
            return ExecEvent(FINISHED, tid, attempt)
        if kind == _START:
            run.started = True
            if run.stop == _NOW:
                self._push(self.now, _FINISH, tid, run.token)
            else:
                self._schedule_iteration(run)
            return ExecEvent(STARTED, tid, attempt, worker=run.worker,
                             host=self._info.get(run.worker, {}).get("host", ""))
        # _ITER: the iteration at run.pos has completed.
        step = run.steps[run.pos]
        run.pos += 1
        duration = run.duration
        run.iteration += 1
        run.since_restore += 1
        run.time_total += duration
        run.time_since_restore += duration
        result = self._result(run, step[1], duration)
        wants = (bool(step[2]) if len(step) > 2 else False) or run.want_checkpoint
        run.want_checkpoint = False
        try:
            hit = stop_dict_hit(spec.stop, result)
        except ValueError as exc:  # the actor fails the trial, naming the key
            run.token = self._next_token()
            return ExecEvent(FINISHED, tid, attempt, error=f"ValueError: {exc}")
        if hit:
            result["done"] = True
        last = hit or bool(result.get("done")) or run.pos >= len(run.steps)
        if checkpoint_due(spec, run.iteration, last):
            wants = True
        reports: list[Report] = []
        path = self._checkpoint(run) if wants else None
        if path is not None:
            result["checkpoint_dir_name"] = path.rsplit("/", 1)[-1]
        run.seq += 1
        reports.append(Report(run.seq, result, path))
        self.num_reports += 1
        if run.stop == _CKPT and not last:
            if path is None:  # a checkpoint-only report, as Attempt._save_only
                run.seq += 1
                reports.append(Report(run.seq, None, self._checkpoint(run)))
            last = True
        if last:
            run.token = self._next_token()
            return ExecEvent(FINISHED, tid, attempt, reports=reports)
        self._schedule_iteration(run)
        return ExecEvent(REPORTS, tid, attempt, reports=reports)

    def _schedule_iteration(self, run: _SimRun) -> None:
        if run.pos >= len(run.steps):  # nothing (left) to run: it returns at once
            self._push(self.now, _FINISH, run.spec.trial_id, run.token)
            return
        step = run.steps[run.pos]
        if not isinstance(step, tuple) or len(step) < 2 or not isinstance(step[1], dict):
            raise TypeError(f"trial_model step {run.pos} of {run.spec.trial_id} must be "
                            f"(duration_s, metrics dict[, checkpoint]), got {step!r}")
        d = float(step[0])
        if d < 0:
            raise ValueError(f"trial_model step {run.pos} of {run.spec.trial_id} has a "
                             f"negative duration {d!r}")
        if self._jitter:  # drawn in scheduling order, which the seed makes reproducible
            d *= self._rng.uniform(1 - self._jitter, 1 + self._jitter)
        run.duration = d
        self._push(self.now + d, _ITER, run.spec.trial_id, run.token)

    def _checkpoint(self, run: _SimRun) -> str:
        path = f"{run.spec.trial_path}/{checkpoint_dir_name(run.ckpt_index)}"
        run.ckpt_index += 1
        self._ckpt_meta[path] = (run.iteration, run.time_total)
        return path

    def _result(self, run: _SimRun, metrics: dict[str, Any], duration: float) -> dict[str, Any]:
        spec = run.spec
        wall = _EPOCH + self.now
        return fill_auto_fields(
            metrics,
            training_iteration=run.iteration,
            iterations_since_restore=run.since_restore,
            time_this_iter_s=duration,
            time_total_s=run.time_total,
            time_since_restore=run.time_since_restore,
            timestamp=wall,
            # Virtual time: UTC, so a simulation's dates do not depend on the machine's zone.
            date=time.strftime("%Y-%m-%d_%H-%M-%S", time.gmtime(wall)),
            trial_id=spec.trial_id,
            experiment_tag=spec.experiment_tag,
            pid=0,
            hostname=self._info.get(run.worker, {}).get("host", ""),
            node_ip="127.0.0.1",
            worker=run.worker,
            config=spec.config,
        )
