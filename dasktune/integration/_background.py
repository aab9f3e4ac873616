"""A logger callback whose calls to a tracking service run on one thread of its own.

MLflow and W&B calls are network round trips (or, for W&B, a service process):
made in the driver's loop, they would hold every trial's results behind them. The
driver hands each call to :meth:`BackgroundLogger.submit`; one thread runs them in
submission order, so a run is created before its metrics and ended after them. A
failing call is logged and never fails the experiment (as the file loggers). The
experiment's end waits for what was handed over, up to ``timeout`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from dasktune.logger import LoggerCallback

logger = logging.getLogger(__name__)


class BackgroundLogger(LoggerCallback):
    """Base for loggers that talk to a service: :meth:`submit` instead of calling."""

    service = "logging"  # named in warnings
    timeout: float = 600.0  # seconds the experiment's end waits for pending calls

    _pool: ThreadPoolExecutor | None = None
    _last: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the logger's thread, after what came before."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"dasktune-{self.service}")
        fut = self._pool.submit(self._guarded, fn, *args, **kwargs)
        self._last = fut
        return fut

    def _guarded(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a logger never fails the experiment
            logger.warning("%s: %s failed: %r", self.service, getattr(fn, "__name__", fn), exc,
                           exc_info=logger.isEnabledFor(logging.DEBUG))
            return None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every call submitted so far ran; False if ``timeout`` passed first."""
        if self._last is None:
            return True
        try:
            self._last.result(timeout=timeout)
        except FutureTimeout:
            return False
        return True

    def close(self) -> None:
        """Wait (up to :attr:`timeout`) for the pending calls, then stop the thread."""
        if self._pool is None:
            return
        if not self.wait(self.timeout):
            logger.error("%s: calls still pending after %.0f s are dropped",
                         self.service, self.timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self._last = None

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.flush()
        self.close()
