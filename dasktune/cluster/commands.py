"""The command lines that start dasktune's own processes on this host.

One place says how a ``dasktune`` subcommand is run from Python (the installed console
script may not be on ``PATH`` in a detached session) and how a local worker is
started; both the local provider and the adaptive pool inside the scheduler use them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["dasktune_command", "worker_command"]


def dasktune_command(*args: str) -> list[str]:
    """``dasktune ARGS...`` run by this Python (``python -c 'from dasktune.cli ...'``)."""
    return [sys.executable, "-c", "from dasktune.cli import main; main()", *args]


def worker_command(address: str, *, nthreads: int, name: str,
                   resources: dict[str, float], extra: Sequence[str] = ()) -> list[str]:
    """The one place that says how a local worker is started (``dasktune worker``).

    No nanny: one PID per worker, so ``kill-random-worker --hard`` kills the worker itself.
    """
    res = ",".join(f"{k}={v:g}" for k, v in {"CPU": nthreads, **resources}.items())
    return dasktune_command("worker", address, "--nthreads", str(nthreads), "--resources", res,
                            "--name", name, "--no-nanny", "--no-dashboard",
                            "--host", "127.0.0.1", *extra)
