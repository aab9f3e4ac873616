"""A worker asks the scheduler to retire it: the one graceful way out for a worker that
knows it is about to go (a spot notice, the end of its batch job).

Retiring through the scheduler changes the worker's status to ``closing_gracefully``,
which :class:`dasktune.execution.recovery.RecoveryPlugin` reports to the driver at once; the driver
checkpoints the trials there and moves them, then asks Dask to finish the retirement.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.core import Status

logger = logging.getLogger(__name__)

__all__ = ["retire_gracefully"]

_LEAVING = (Status.closing, Status.closing_gracefully, Status.closed)


async def retire_gracefully(worker: Any, reason: str) -> None:
    """Ask the scheduler to retire ``worker`` (closing it once its trials moved); nothing
    when the worker is already on its way out (``--lifetime``, a SIGTERM, an earlier
    notice), whose close would otherwise race this one."""
    if worker.status in _LEAVING:
        return
    logger.warning("%s: %s; retiring gracefully", worker.address, reason)
    try:
        await worker.scheduler.retire_workers(
            workers=[worker.address], close_workers=True, remove=True)
    except Exception:  # noqa: BLE001 - scheduler gone: still leave in order
        logger.exception("retire through the scheduler failed; closing gracefully")
        await worker.close_gracefully()
