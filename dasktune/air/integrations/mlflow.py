"""Ray's ``ray.air.integrations.mlflow`` path: :mod:`dasktune.integration.mlflow`."""

from __future__ import annotations

from dasktune.integration.mlflow import MLflowLoggerCallback, setup_mlflow

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
