"""Ray's ``ray.air.integrations.wandb`` path: :mod:`dasktune.integration.wandb`."""

from __future__ import annotations

from dasktune.integration.wandb import WandbLoggerCallback, setup_wandb

__all__ = ["WandbLoggerCallback", "setup_wandb"]
