"""Synchronous HyperBand: brackets of successive halving that pause trials at each milestone."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dasktune.schedulers._base import TrialScheduler, finite, result_value
from dasktune.trial import PAUSED, PENDING, RUNNING

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["HyperBandScheduler"]


class _Bracket:
    """One successive-halving run: ``n`` trials to ``r``, keep ``n / eta`` to ``r * eta``, ...

    ``live`` maps trial id -> (time reached, score); scores are "higher is better".
    """

    def __init__(self, n0: int, r0: int, max_t: int, eta: int, s: int, stop_last_trials: bool):
        self.n0 = self.n = n0
        self.r0 = self.r = r0
        self.max_t = max_t
        self.eta = eta
        self.halves = s
        self.stop_last_trials = stop_last_trials
        self.live: dict[str, tuple[float, float | None]] = {}
        self.all_trials: list[str] = []
        self.to_unpause: set[str] = set()
        self.total_work = self._total_work(n0, r0, s)
        self.completed = 0.0

    def _total_work(self, n: int, r: int, s: int) -> float:
        work = 0.0
        cumul = 0
        for _ in range(s + 1):
            work += n * (r - cumul)
            cumul = r
            n = int(math.ceil(n / self.eta))
            r = int(min(r * self.eta, self.max_t))
        return work

    def filled(self) -> bool:
        return len(self.all_trials) >= self.n0

    def add(self, trial_id: str) -> None:
        self.live[trial_id] = (0.0, None)
        self.all_trials.append(trial_id)

    def update(self, trial_id: str, t: float, score: float | None) -> None:
        prev = self.live[trial_id][0]
        self.completed += max(0.0, min(t, self.r) - min(prev, self.r))
        self.live[trial_id] = (t, score)

    def reached(self, trial_id: str) -> bool:
        return self.live[trial_id][0] >= self.r

    def continue_trial(self, trial_id: str) -> bool:
        if self.halves == 0 and not self.stop_last_trials:
            return True
        return not self.reached(trial_id)

    def cur_iter_done(self) -> bool:
        return all(t >= self.r for t, _ in self.live.values())

    def finished(self) -> bool:
        return self.stop_last_trials and self.halves == 0 and self.cur_iter_done()

    def successive_halving(self) -> tuple[list[str], list[str]]:
        """Keep the best ``ceil(n / eta)`` live trials and raise the milestone."""
        self.halves -= 1
        self.n = int(math.ceil(self.n / self.eta))
        self.r = int(min(self.r * self.eta, self.max_t))
        # Unscored trials (NaN metric) rank last; ties keep arrival order.
        ranked = sorted(self.live, key=lambda tid: (
            self.live[tid][1] if self.live[tid][1] is not None else -math.inf))
        return ranked[-self.n:], ranked[:-self.n]

    def completion(self) -> float:
        return self.completed / self.total_work if self.total_work else 1.0

    def debug_str(self) -> str:
        return (f"Bracket(Max Size (n)={self.n}, Milestone (r)={self.r}, "
                f"completed={100 * self.completion():.1f}%, live={len(self.live)})")


class HyperBandScheduler(TrialScheduler):
    """Ray's synchronous ``HyperBandScheduler``.

    Trials fill brackets in order. In a bracket, a trial reaching the milestone is paused
    until every live trial of the bracket has reached it; then the best ``1 / reduction_factor``
    are resumed (via :meth:`choose_trial_to_run`) to the next milestone and the rest stopped.
    Needs trials that checkpoint, since paused trials resume from their checkpoint.

    Args:
        time_attr: the monotonically increasing result key that measures progress.
        metric: the result key to compare; with ``mode`` it may come from ``TuneConfig``.
        mode: ``"min"`` or ``"max"``.
        max_t: the most ``time_attr`` a trial gets; also sets the number of brackets.
        reduction_factor: each halving keeps ``1 / reduction_factor`` of a bracket.
        stop_last_trials: stop trials of the last halving at ``max_t`` (else they run on).
    """

    _state_attrs = ("_hyperbands", "_trial_info", "_band_idx", "_cur", "_num_stopped",
                    "_doomed")

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ):
        super().__init__(metric, mode)
        name = type(self).__name__
        if not max_t > 0:
            raise ValueError(f"{name}: max_t must be positive, got {max_t!r}")
        if not reduction_factor > 1:
            raise ValueError(f"{name}: reduction_factor must be > 1, got {reduction_factor!r}")
        self._time_attr = time_attr
        self._eta = reduction_factor
        self._max_t = max_t
        self._stop_last_trials = stop_last_trials
        self._s_max_1 = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        # Bands of brackets: band k holds brackets s = 0 .. s_max in the order they fill
        # (see _bracket_halvings), None where too small.
        self._hyperbands: list[list[_Bracket | None]] = [[]]
        self._band_idx = 0
        self._cur: tuple[int, int] | None = None  # (band, bracket) being filled
        self._trial_info: dict[str, tuple[int, int]] = {}
        self._num_stopped = 0
        # Paused trials cut by a halving: the driver should terminate them (trials_to_stop).
        self._doomed: set[str] = set()

    # -------------------------------------------------------------- brackets
    def _n0(self, s: int) -> int:
        return int(math.ceil(self._s_max_1 / (s + 1) * self._eta ** s))

    def _r0(self, s: int) -> int:
        return int(self._max_t * self._eta ** (-s))

    def _bracket_halvings(self, position: int) -> int:
        """The halvings ``s`` of the bracket at ``position`` in a band: HyperBand fills the
        band from the bracket with none (the fewest trials) up."""
        return position

    def _milestone(self, trial_id: str, t: float) -> float | None:
        """The milestone (``time_attr``) that ``trial_id`` reached at ``t``, or None if it
        is still short of its bracket's next one."""
        bracket = self._bracket(trial_id)
        if bracket is None or trial_id not in bracket.live or t < bracket.r:
            return None
        if bracket.halves == 0 and not bracket.stop_last_trials:
            return None  # the last rung runs on: no milestone
        return bracket.r

    def _bracket(self, trial_id: str) -> _Bracket | None:
        info = self._trial_info.get(trial_id)
        if info is None:
            return None
        return self._hyperbands[info[0]][info[1]]

    def on_trial_add(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._require_metric()
        if trial.trial_id in self._trial_info:
            return  # a restored trial announced again
        cur = None if self._cur is None else self._hyperbands[self._cur[0]][self._cur[1]]
        if cur is None or cur.filled():
            while True:
                band = self._hyperbands[self._band_idx]
                if len(band) >= self._s_max_1:
                    self._hyperbands.append([])
                    self._band_idx += 1
                    band = self._hyperbands[self._band_idx]
                s = self._bracket_halvings(len(band))
                if self._r0(s) == 0:
                    band.append(None)  # bracket too small for max_t: skip it
                    continue
                band.append(_Bracket(self._n0(s), self._r0(s), self._max_t, self._eta, s,
                                     self._stop_last_trials))
                self._cur = (self._band_idx, len(band) - 1)
                break
        assert self._cur is not None
        self._hyperbands[self._cur[0]][self._cur[1]].add(trial.trial_id)  # type: ignore[union-attr]
        self._trial_info[trial.trial_id] = self._cur

    # -------------------------------------------------------------- results
    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str:
        self._require_metric()
        name = type(self).__name__
        tid = trial.trial_id
        t = result_value(result, self._time_attr, trial, name)
        value = result_value(result, self._metric, trial, name)
        if tid in self._doomed:  # resumed by a driver that ignores trials_to_stop
            self._doomed.discard(tid)
            return self.STOP
        bracket = self._bracket(tid)
        if bracket is None or tid not in bracket.live:
            return self.CONTINUE
        bracket.update(tid, t, self._metric_op * value if finite(value) else None)
        if bracket.continue_trial(tid):
            return self.CONTINUE
        if bracket.halves == 0:  # last halving done and max_t reached: nothing to wait for
            bracket.live.pop(tid)
            return self.STOP
        return self._process(tune_controller, bracket, tid)

    @staticmethod
    def _ready(ctx: SchedulerContext, bracket: _Bracket) -> bool:
        """Every live trial reached the milestone, and no more trials will join: the
        driver adds trials as slots free up (Ray queues them all up front), so a bracket
        halved before it filled would judge its first few trials alone."""
        if not bracket.cur_iter_done():
            return False
        search_finished = getattr(ctx, "search_finished", None)
        return bracket.filled() or search_finished is None or bool(search_finished())

    def _process(self, ctx: SchedulerContext, bracket: _Bracket, current: str | None) -> str:
        """Halve the bracket if it is :meth:`_ready`; else pause ``current``."""
        if not self._ready(ctx, bracket):
            return self.PAUSE
        if bracket.finished():
            for tid in list(bracket.live):
                if tid != current:
                    self._doomed.add(tid)
                bracket.live.pop(tid)
            return self.STOP
        good, bad = bracket.successive_halving()
        self._num_stopped += len(bad)
        action = self.PAUSE
        for tid in bad:
            bracket.live.pop(tid)
            if tid == current:
                action = self.STOP
            else:
                self._doomed.add(tid)
        for tid in good:
            if tid == current:
                action = self.CONTINUE
            else:
                bracket.to_unpause.add(tid)
        return action

    def _leave(self, ctx: SchedulerContext, trial: Trial) -> None:
        tid = trial.trial_id
        self._doomed.discard(tid)
        bracket = self._bracket(tid)
        if bracket is None or tid not in bracket.live:
            return
        bracket.live.pop(tid)
        bracket.to_unpause.discard(tid)
        if bracket.live and not bracket.finished() and self._ready(ctx, bracket):
            self._process(ctx, bracket, None)

    def on_trial_complete(self, tune_controller: SchedulerContext, trial: Trial,
                          result: dict[str, Any]) -> None:
        self._leave(tune_controller, trial)

    def on_trial_error(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._leave(tune_controller, trial)

    def on_trial_remove(self, tune_controller: SchedulerContext, trial: Trial) -> None:
        self._leave(tune_controller, trial)

    # -------------------------------------------------------------- running
    def choose_trial_to_run(self, tune_controller: SchedulerContext) -> Trial | None:
        """A PENDING trial, or a PAUSED one promoted by a halving; least complete bracket first."""
        by_id = {t.trial_id: t for t in tune_controller.get_trials()}
        trial = self._promotable(by_id)
        if trial is not None:
            return trial
        # The searcher ran dry with a bracket short of its size: halve it as it is.
        halved = False
        for band in self._hyperbands:
            for bracket in band:
                if bracket is not None and bracket.live and not bracket.filled() and \
                        not bracket.finished() and self._ready(tune_controller, bracket):
                    self._process(tune_controller, bracket, None)
                    halved = True
        if halved:
            trial = self._promotable(by_id)
            if trial is not None:
                return trial
        return self._doomed_to_resume(by_id)

    def _promotable(self, by_id: dict[str, Trial]) -> Trial | None:
        for band in self._hyperbands:
            brackets = [b for b in band if b is not None]
            for bracket in sorted(brackets, key=lambda b: b.completion()):
                for tid in bracket.all_trials:
                    trial = by_id.get(tid)
                    if trial is None or tid not in bracket.live:
                        continue
                    if trial.status == PENDING or (
                            trial.status == PAUSED and bracket.continue_trial(tid)):
                        bracket.to_unpause.discard(tid)
                        return trial
        return None

    def _doomed_to_resume(self, by_id: dict[str, Trial]) -> Trial | None:
        # Nothing promotable: resume a cut trial only so a driver that ignores trials_to_stop
        # still ends (its first result is answered STOP).
        for tid in sorted(self._doomed):
            trial = by_id.get(tid)
            if trial is not None and trial.status in (PENDING, PAUSED) and not any(
                    t.status == RUNNING for t in by_id.values()):
                return trial
        return None

    def trials_to_stop(self, tune_controller: SchedulerContext) -> list[Trial]:
        out = [t for t in tune_controller.get_trials()
               if t.trial_id in self._doomed and t.status in (PENDING, PAUSED)]
        for t in out:
            self._doomed.discard(t.trial_id)
        return out

    def debug_string(self) -> str:
        lines = [f"Using HyperBand: num_stopped={self._num_stopped} "
                 f"total_brackets={sum(len(b) for b in self._hyperbands)}"]
        for i, band in enumerate(self._hyperbands):
            lines.append(f"Round #{i}:")
            lines.extend(f"  {b.debug_str()}" for b in band if b is not None)
        return "\n".join(lines)
