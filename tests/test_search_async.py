"""A slow searcher does not stall the driver loop: once a ``suggest`` is slow, the
searcher is asked on a thread of its own, one call at a time, in the driver's order."""

from __future__ import annotations

import time

import dask.config
import pytest

import dasktune as tune
from dasktune.search import Searcher, SearchGenerator

ASK_S = 0.3
# Module-level: Tuner deep-copies its searcher (as Ray does), so the test reads what the
# copy recorded here. COUNT[0]: results the driver took so far.
COUNT = [0]
LOG: dict[str, list] = {}


class SlowSearcher(Searcher):
    """Takes ASK_S per suggestion; records how many results the driver took meanwhile,
    and whether two of its methods ever ran at once."""

    def __init__(self, n: int, fail_at: int | None = None):
        super().__init__(metric="loss", mode="min")
        self.n = n
        self.fail_at = fail_at
        self.asked = 0
        LOG.clear()
        LOG.update(during=[], calls=[], overlaps=[])
        self._active = 0  # methods running now (a plain int: tuner.pkl pickles searchers)

    def _enter(self) -> None:
        self._active += 1
        if self._active > 1:
            LOG["overlaps"].append(1)

    def _leave(self) -> None:
        self._active -= 1

    def suggest(self, trial_id: str):
        self._enter()
        try:
            if self.asked >= self.n:
                return Searcher.FINISHED
            self.asked += 1
            if self.fail_at is not None and self.asked == self.fail_at:
                raise RuntimeError("the searcher broke")
            before = COUNT[0]
            time.sleep(ASK_S)
            LOG["during"].append(COUNT[0] - before)
            LOG["calls"].append(("suggest", trial_id))
            return {"x": float(self.asked)}
        finally:
            self._leave()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._enter()
        try:
            LOG["calls"].append(("result", trial_id))
        finally:
            self._leave()

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self._enter()
        try:
            LOG["calls"].append(("complete", trial_id))
        finally:
            self._leave()


class Count(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        COUNT[0] += 1


def steady(config):
    for i in range(150):
        time.sleep(0.01)
        tune.report({"loss": config["x"] / (i + 1)})


def _fit(searcher: SlowSearcher, tmp_path, samples: int):
    tuner = tune.Tuner(
        steady, param_space={},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=samples,
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0,
                                  callbacks=[Count()]),
    )
    return tuner.fit()


def test_slow_suggest_runs_beside_the_loop(local_client, tmp_path):
    results = _fit(SlowSearcher(n=4), tmp_path, samples=4)

    assert len(results) == 4 and results.num_errors == 0
    assert all(r.metrics["training_iteration"] == 150 for r in results)
    # The first (slow) ask blocked the loop; asks made while trials ran did not.
    assert len(LOG["during"]) == 4 and max(LOG["during"][1:]) > 0, LOG["during"]
    assert not LOG["overlaps"]
    # Every trial's results reached the searcher in order, then its completion.
    for tid in {t for kind, t in LOG["calls"] if kind == "suggest"}:
        mine = [kind for kind, t in LOG["calls"] if t == tid]
        assert mine[0] == "suggest" and mine[-1] == "complete"
        assert mine.count("result") == 150


def test_fast_searcher_stays_on_the_driver_thread():
    class Quick(Searcher):
        def suggest(self, trial_id):
            return {"x": 1.0}

    gen = SearchGenerator(Quick(metric="loss", mode="min"), 3)
    gen.set_search_properties("loss", "min", {})
    assert all(gen.next_trial() is not None for _ in range(3))
    assert gen._thread is None and gen.next_trial() is None and gen.is_finished()


def test_error_in_a_threaded_suggest_reaches_fit(local_client, tmp_path):
    with pytest.raises(RuntimeError, match="the searcher broke"):
        _fit(SlowSearcher(n=4, fail_at=3), tmp_path, samples=4)


def test_state_is_taken_after_queued_calls():
    gen = SearchGenerator(SlowSearcher(n=3), 3)
    gen.set_search_properties("loss", "min", {})
    first = gen.next_trial()  # slow: later calls go to the thread
    assert first is not None and gen._thread is not None
    deadline = time.monotonic() + 10
    second = None
    while second is None and time.monotonic() < deadline:
        second = gen.next_trial()
        time.sleep(0.01)
    assert second is not None
    gen.on_trial_complete(first.trial_id, {"loss": 1.0})
    state = gen.get_state()  # waits for the queued completion
    assert ("complete", first.trial_id) in LOG["calls"]
    assert state["counter"] == 2
    gen.close()


def test_setting_off_keeps_asks_on_the_driver_thread():
    gen = SearchGenerator(SlowSearcher(n=2), 2)
    gen.set_search_properties("loss", "min", {})
    with dask.config.set({"dasktune.search.async-after": False}):
        assert gen.next_trial() is not None and gen.next_trial() is not None
    assert gen._thread is None
