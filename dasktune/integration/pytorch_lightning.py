"""PyTorch Lightning callbacks that report a trainer's logged metrics to Tune and
checkpoint it (Ray's ``ray.tune.integration.pytorch_lightning``; also reachable as
``dasktune.integration.lightning``).

The callbacks derive from ``lightning.pytorch.Callback`` and, when the older
``pytorch_lightning`` package is installed too, from its ``Callback`` as well: a
trainer of either package takes them (Ray's take only ``lightning.pytorch``'s when
both are installed).
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from typing import Any

from dasktune.integration._report import Metrics, normalize_metrics, report_checkpoint
from dasktune.session import report

try:
    from lightning.pytorch import Callback as _LightningCallback
except ImportError:  # pragma: no cover - depends on the environment
    _LightningCallback = None
try:
    from pytorch_lightning import Callback as _PLCallback
except ImportError:  # pragma: no cover - depends on the environment
    _PLCallback = None
_BASES = tuple(b for b in (_LightningCallback, _PLCallback) if b is not None)
if not _BASES:  # pragma: no cover - depends on the environment
    raise ImportError('dasktune.integration.pytorch_lightning needs Lightning: '
                      'pip install "dasktune[lightning]"')

logger = logging.getLogger(__name__)

# Every hook of the installed Lightning's Callback ("on_validation_end", ...).
_HOOKS = frozenset(name for base in _BASES
                   for name, _ in inspect.getmembers(base, inspect.isfunction)
                   if name.startswith("on_"))


def _hook(name: str) -> Any:
    def hook(self: TuneCallback, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if name in self._on:
            self._handle(trainer, args[0] if args else kwargs.get("pl_module"))
    hook.__name__ = name
    hook.__doc__ = (f"Lightning's ``{name}``: reports (see :meth:`TuneCallback._handle`) when "
                    f"``{name[3:]!r}`` is among the hooks named in ``on``.")
    return hook


class TuneCallback(*_BASES):  # type: ignore[misc]
    """Base of the Tune callbacks: runs :meth:`_handle` at the hooks named in ``on``
    (Lightning's hook names less ``on_``, e.g. ``"validation_end"``, ``"train_end"``)."""

    def __init__(self, on: str | list[str] = "validation_end"):
        hooks = [on] if isinstance(on, str) else list(on)
        bad = [h for h in hooks if f"on_{h}" not in _HOOKS]
        if bad:
            raise ValueError(f"invalid hook(s) {bad}: use Lightning's hook names without "
                             f"'on_', one of {sorted(h[3:] for h in _HOOKS)}")
        self._on = frozenset(f"on_{h}" for h in hooks)

    def _handle(self, trainer: Any, pl_module: Any) -> None:
        raise NotImplementedError


for _name in _HOOKS:
    setattr(TuneCallback, _name, _hook(_name))


class TuneReportCheckpointCallback(TuneCallback):
    """Report the trainer's ``callback_metrics`` at the ``on`` hooks, each report with a
    checkpoint of the trainer (``trainer.save_checkpoint``) unless ``save_checkpoints``
    is False. Nothing is reported during the sanity check, or when no metric is there.

    Args:
        metrics: the metrics to report: a name logged with ``self.log``, a list of
            them, or ``{reported_name: logged_name}``; all of them when None. A name
            not logged (yet) is left out with a warning.
        filename: the checkpoint's file name (load it with
            ``YourModule.load_from_checkpoint``).
        save_checkpoints: report checkpoints with the metrics.
        on: the hooks to report at (default ``"validation_end"``).
    """

    def __init__(self, metrics: Metrics = None, filename: str = "checkpoint",
                 save_checkpoints: bool = True, on: str | list[str] = "validation_end"):
        super().__init__(on=on)
        self._metrics = normalize_metrics(metrics)
        self._filename = filename
        self._save_checkpoints = save_checkpoints

    def _report_dict(self, trainer: Any) -> dict[str, Any]:
        logged = trainer.callback_metrics
        if not self._metrics:
            return {k: v.item() for k, v in logged.items()}
        pairs = self._metrics.items() if isinstance(self._metrics, dict) else \
            ((m, m) for m in self._metrics)
        out = {}
        for reported, name in pairs:
            if name in logged:
                out[reported] = logged[name].item()
            else:
                logger.warning("metric %r is not in trainer.callback_metrics (%s)", name,
                               sorted(logged))
        return out

    def _handle(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        metrics = self._report_dict(trainer)
        if not metrics:
            return
        if self._save_checkpoints:
            report_checkpoint(metrics, lambda folder: trainer.save_checkpoint(
                os.path.join(folder, self._filename)))
        else:
            report(metrics)


class TuneReportCallback(TuneReportCheckpointCallback):
    """Report the trainer's metrics at the ``on`` hooks, without checkpoints
    (deprecated in Ray in favour of ``TuneReportCheckpointCallback``)."""

    def __init__(self, metrics: Metrics = None, on: str | list[str] = "validation_end"):
        warnings.warn("TuneReportCallback is deprecated (as in Ray): use "
                      "TuneReportCheckpointCallback(save_checkpoints=False)",
                      DeprecationWarning, stacklevel=2)
        super().__init__(metrics=metrics, save_checkpoints=False, on=on)


__all__ = ["TuneCallback", "TuneReportCallback", "TuneReportCheckpointCallback"]
