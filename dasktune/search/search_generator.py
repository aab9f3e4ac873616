"""``SearchGenerator``: a :class:`Searcher` driven as a :class:`SearchAlgorithm` (Ray's).

It asks the searcher for one config per new trial id, stops after ``num_samples`` (never,
for -1) or when the searcher says FINISHED, and lays each suggestion over the param space so
its constants reach the trial. Searchers do not expand grid_search; a grid in the param space
is an error here, as it is in Ray.

A searcher whose ``suggest`` gets slow (TPE or GP with thousands of finished trials take
0.1-1 s per ask) would stall the driver loop: no report taken, no slot filled. Once one
``suggest`` takes longer than ``dasktune.search.async-after``, every later call to the
searcher runs on a thread of its own, in the order the driver made it: the loop goes on
while the next suggestion is computed, and the searcher still sees one caller at a time.
The asks are not made ahead of free slots (that would cost search quality).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dasktune import _dask_config
from dasktune import space as sp
from dasktune.metric_mode import merge_search_properties
from dasktune.search._base import (
    SearchAlgorithm,
    Searcher,
    Suggestion,
    check_num_samples,
)

__all__ = ["SearchGenerator"]

logger = logging.getLogger(__name__)

_BOTH_SPACES = (
    "You passed a `param_space` with search parameters (at {paths}) to the Tuner, but the "
    "searcher {name} was already instantiated with a search space. Make sure `param_space` "
    "holds no more parameter definitions: include them in the searcher's search space instead."
)


class SearchGenerator(SearchAlgorithm):
    """Wraps ``searcher`` for the driver loop.

    Args:
        searcher: any :class:`Searcher` (OptunaSearch, ConcurrencyLimiter, Repeater, ...).
        num_samples: trials to make; -1 for unbounded; None to take the ``num_samples``
            keyword of :meth:`set_search_properties` (default 1).
        experiment_uid: the 8-hex trial-id prefix (default: random).

    Set :attr:`asks_inline` to ask the searcher on the caller's thread every time (a
    step-by-step check, a latency benchmark), never on a thread of its own after a slow ask.
    """

    asks_inline: bool = False

    def __init__(
        self,
        searcher: Searcher,
        num_samples: int | None = None,
        *,
        experiment_uid: str | None = None,
    ) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"SearchGenerator needs a dasktune.search.Searcher, got {type(searcher).__name__}"
            )
        super().__init__(experiment_uid=experiment_uid)
        self.searcher = searcher
        self._thread: _SearcherThread | None = None  # set once a suggest was slow
        self._ask: _Ask | None = None  # the suggestion being computed on it
        self._explicit_samples = num_samples is not None
        self._num_samples = check_num_samples(num_samples, "SearchGenerator") if (
            num_samples is not None
        ) else 1
        self._param_space: dict[str, Any] = {}

    def set_search_properties(self, metric: Any, mode: Any, config: dict, **spec: Any) -> bool:
        """Pass metric, mode and the param space to the searcher.

        Raises ValueError, like Ray, when the searcher already has its own space and
        ``config`` defines parameters too, when ``config`` holds a grid_search, and when
        ``metric``/``mode`` contradict the searcher's own.
        """
        super().set_search_properties(metric, mode, config, **spec)
        config = {} if config is None else config
        sp.validate_param_space(config)
        if not self._explicit_samples and "num_samples" in spec:
            self._num_samples = check_num_samples(spec["num_samples"], "SearchGenerator")
        own = (self.searcher.metric, self.searcher.mode)
        if merge_search_properties(own, (metric, mode), refuse_twice=False) is None:
            raise ValueError(
                f"TuneConfig(metric={metric!r}, mode={mode!r}) contradicts the searcher's own "
                f"metric={own[0]!r}, mode={own[1]!r} ({type(self.searcher).__name__}); set "
                "them in one place"
            )
        accepted = self.searcher.set_search_properties(metric, mode, dict(config), **spec)
        unresolved = [
            sp.path_str(p)
            for p, v in sp.leaves(config)
            if isinstance(v, sp.Domain) or sp.is_grid(v)
        ]
        if not accepted and unresolved:
            raise ValueError(
                _BOTH_SPACES.format(
                    paths=", ".join(f"'{p}'" for p in unresolved),
                    name=type(self.searcher).__name__,
                )
            )
        grids = [sp.path_str(p) for p, v in sp.leaves(config) if sp.is_grid(v)]
        if grids:
            raise ValueError(
                f"grid_search at {', '.join(repr(g) for g in grids)} can't be used with the "
                f"searcher {type(self.searcher).__name__}: searchers don't expand grids. Use "
                "tune.choice(...), or the default BasicVariantGenerator for a grid"
            )
        self._param_space = dict(config)
        return True

    @property
    def total_samples(self) -> int | None:
        return self._num_samples

    def next_trial(self) -> Suggestion | None:
        """Ask the searcher; None when it has nothing now or the search is finished."""
        if self._finished:
            return None
        if self._num_samples is not None and self._counter >= self._num_samples:
            self._finished = True
            return None
        if self._thread is not None:
            return self._next_async(self._thread)
        trial_id = self._trial_id()
        start = time.perf_counter()
        suggested = self.searcher.suggest(trial_id)
        slow = None if self.asks_inline else _async_after()
        if slow is not None and time.perf_counter() - start > slow:
            logger.debug("%s.suggest took %.0f ms: asking on a thread from now on",
                         type(self.searcher).__name__, 1e3 * (time.perf_counter() - start))
            self._thread = _SearcherThread(type(self.searcher).__name__)
        return self._accept(trial_id, suggested)

    @property
    def asking(self) -> bool:
        """Whether a suggestion is being computed on the searcher's thread."""
        return self._ask is not None

    def _next_async(self, thread: _SearcherThread) -> Suggestion | None:
        thread.raise_error()
        ask = self._ask
        if ask is None:
            self._ask = ask = _Ask(self._trial_id())
            thread.submit(ask.run, self.searcher)
        if not ask.done.is_set():
            return None
        self._ask = None
        return self._accept(ask.trial_id, ask.result)

    def _accept(self, trial_id: str, suggested: Any) -> Suggestion | None:
        if suggested == Searcher.FINISHED:
            self._finished = True
            return None
        if suggested is None:
            return None
        if not isinstance(suggested, Mapping):
            raise TypeError(
                f"{type(self.searcher).__name__}.suggest() must return a dict, None or "
                f"Searcher.FINISHED, got {type(suggested).__name__}"
            )
        config = _merge(sp.copy_containers(self._param_space), dict(suggested))
        left = [sp.path_str(p) for p, v in sp.leaves(config) if isinstance(v, sp.Domain)]
        if left:
            raise ValueError(
                f"{type(self.searcher).__name__} suggested no value for "
                f"{', '.join(repr(x) for x in left)} of the param_space"
            )
        # tag what was searched, not the param_space's constants (Ray tags everything)
        constants = {p for p, v in sp.leaves(self._param_space) if not isinstance(v, sp.Domain)}
        tag_vars = {p: v for p, v in sp.leaves(suggested) if p not in constants}
        tag = str(self._counter) + (f"_{sp.format_vars(tag_vars)}" if tag_vars else "")
        self._counter += 1
        return Suggestion(trial_id=trial_id, config=config, experiment_tag=tag)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._call(self.searcher.on_trial_result, trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self._call(self.searcher.on_trial_complete, trial_id, result, error)

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._thread is None:
            fn(*args)
        else:
            self._thread.raise_error()
            self._thread.submit(fn, *args)

    def close(self) -> None:
        """End the searcher's thread (after the calls queued on it)."""
        thread, self._thread, self._ask = self._thread, None, None
        if thread is not None:
            thread.close()

    def get_state(self) -> dict:
        if self._thread is not None:
            self._thread.drain()  # the searcher's state after every call made so far
        state = super().get_state()
        state["num_samples"] = self._num_samples
        try:
            state["searcher"] = self.searcher.get_state()
        except NotImplementedError:
            logger.warning(
                "%s has no get_state(); a restored experiment restarts its search",
                type(self.searcher).__name__,
            )
            state["searcher"] = None
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._num_samples = state["num_samples"]
        if state.get("searcher") is not None:
            self.searcher.set_state(state["searcher"])


def _async_after() -> float | None:
    """The ``suggest`` duration past which the searcher gets a thread (None: never)."""
    if _dask_config.get("search.async-after") is False:
        return None
    return _dask_config.get_seconds("search.async-after")


class _Ask:
    """One suggestion computed on the searcher's thread."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self.result: Any = None
        self.done = threading.Event()

    def run(self, searcher: Searcher) -> None:
        try:
            self.result = searcher.suggest(self.trial_id)
        finally:
            self.done.set()


class _SearcherThread:
    """Runs calls to one searcher in submission order on a daemon thread; the first
    exception is raised again on the driver's next call."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"dasktune-searcher-{name}")
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._jobs.put((fn, args))

    def drain(self) -> None:
        """Wait until every submitted call has run."""
        self._jobs.join()
        self.raise_error()

    def raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                fn, args = job
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - raised on the driver's thread
                if self._error is None:
                    self._error = exc
            finally:
                self._jobs.task_done()


def _merge(base: dict, update: Mapping) -> dict:
    """Ray's ``merge_dicts``: ``update`` laid over ``base``, dicts merged key by key."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base
