"""``dasktune.integration.lightning``: the same module as
:mod:`dasktune.integration.pytorch_lightning` (Ray's path), under Lightning's new name."""

from __future__ import annotations

from dasktune.integration.pytorch_lightning import (
    TuneCallback,
    TuneReportCallback,
    TuneReportCheckpointCallback,
)

__all__ = ["TuneCallback", "TuneReportCallback", "TuneReportCheckpointCallback"]
