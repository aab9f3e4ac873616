"""Shared bits of the scale benchmarks: models, no-op loggers, result printing."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from dasktune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback


class LazySteps(Sequence):
    """``n`` iterations of ``duration`` s made on demand (no memory per report)."""

    def __init__(self, n: int, duration: float):
        self.n = n
        self.duration = duration

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[float, dict[str, float]]:  # type: ignore[override]
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (self.duration, {"loss": 1.0 / (i + 1)})


class _Quiet:
    """Mixin: a default logger that writes nothing (Tuner.fit adds a default logger only
    when no instance of its class is given, so passing these turns the loggers off)."""

    def setup(self, *args: Any, **info: Any) -> None:
        pass

    def log_trial_start(self, *a: Any, **k: Any) -> None:
        pass

    log_trial_restore = log_trial_save = log_trial_result = log_trial_end = log_trial_start

    def flush(self, *a: Any, **k: Any) -> None:
        pass

    def on_experiment_end(self, *a: Any, **k: Any) -> None:
        pass


class NoJson(_Quiet, JsonLoggerCallback):
    pass


class NoCSV(_Quiet, CSVLoggerCallback):
    pass


class NoTBX(_Quiet, TBXLoggerCallback):
    pass


def no_loggers() -> list[Any]:
    return [NoJson(), NoCSV(), NoTBX()]


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def emit(row: dict[str, Any]) -> None:
    """One result row: human-readable on stderr, JSON on stdout (for the parent)."""
    print(json.dumps(row), flush=True)
    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in row.items()), file=sys.stderr, flush=True)
