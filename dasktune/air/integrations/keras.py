"""Ray's ``ray.air.integrations.keras`` path: :mod:`dasktune.integration.keras`."""

from __future__ import annotations

from dasktune.integration.keras import ReportCheckpointCallback, TuneReportCheckpointCallback

__all__ = ["ReportCheckpointCallback", "TuneReportCheckpointCallback"]
