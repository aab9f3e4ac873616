"""Keras callbacks that report ``model.fit``'s logs to Tune and checkpoint the model
(Ray's ``ray.tune.integration.keras`` and ``ray.air.integrations.keras``).

Built on ``tensorflow.keras`` (as Ray), or on standalone Keras 3 when TensorFlow is
not installed. Checkpoints hold the model saved as ``model.keras``
(``keras.models.load_model`` loads it).
"""

from __future__ import annotations

import os
from typing import Any

from dasktune.integration._report import Metrics, normalize_metrics, pick_metrics, report_checkpoint
from dasktune.session import report

try:
    from tensorflow.keras.callbacks import Callback as _KerasCallback
except ImportError:
    try:
        from keras.callbacks import Callback as _KerasCallback
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"dasktune.integration.keras needs Keras: pip install "
                          f"\"dasktune[keras]\" (Keras 3; without TensorFlow, set "
                          f"KERAS_BACKEND=torch or jax) or tensorflow ({exc})") from exc

MODEL_FILENAME = "model.keras"
_HOOKS = ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end",
          "test_batch_begin", "test_batch_end", "predict_batch_begin", "predict_batch_end",
          "train_begin", "train_end", "test_begin", "test_end", "predict_begin", "predict_end")


def _hooks(on: str | list[str], what: str) -> list[str]:
    hooks = [on] if isinstance(on, str) else list(on)
    bad = [h for h in hooks if h not in _HOOKS]
    if bad:
        raise ValueError(f"{what}: invalid hook(s) {bad}: use Keras's hook names without "
                         f"'on_', one of {list(_HOOKS)}")
    return hooks


class TuneReportCheckpointCallback(_KerasCallback):
    """Report the Keras logs at the ``report_metrics_on`` hooks and, at the
    ``checkpoint_on`` hooks, report them with a checkpoint of the model.

    Args:
        checkpoint_on: hooks (Keras's names less ``on_``) to checkpoint at.
        report_metrics_on: hooks to report at (every checkpoint reports too).
        metrics: a logged name, a list of them, or ``{reported_name: logged_name}``;
            every logged value when None.
    """

    def __init__(self, checkpoint_on: str | list[str] = "epoch_end",
                 report_metrics_on: str | list[str] = "epoch_end", metrics: Metrics = None):
        super().__init__()
        self._checkpoint_on = _hooks(checkpoint_on, "checkpoint_on")
        self._report_metrics_on = _hooks(report_metrics_on, "report_metrics_on")
        self._metrics = normalize_metrics(metrics)

    def _handle(self, logs: dict[str, Any] | None, when: str) -> None:
        if when not in self._checkpoint_on and when not in self._report_metrics_on:
            return
        metrics = pick_metrics(self._metrics, {k: float(v) if hasattr(v, "__float__") else v
                                               for k, v in (logs or {}).items()})
        if when in self._checkpoint_on:
            report_checkpoint(metrics, lambda folder: self.model.save(
                os.path.join(folder, MODEL_FILENAME)))
        else:
            report(metrics)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "epoch_begin")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "epoch_end")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "train_batch_begin")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "train_batch_end")

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "test_batch_begin")

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "test_batch_end")

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "predict_batch_begin")

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "predict_batch_end")

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "train_begin")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "train_end")

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "test_begin")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "test_end")

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "predict_begin")

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle(logs, "predict_end")


# Ray's ray.air.integrations.keras name for the same callback.
ReportCheckpointCallback = TuneReportCheckpointCallback


class TuneReportCallback(TuneReportCheckpointCallback):
    """Report the Keras logs at the ``on`` hooks, without checkpoints.

    Ray 2.60 removed this class (its constructor raises); dasktune keeps the older
    scripts that use it working.
    """

    def __init__(self, metrics: Metrics = None, on: str | list[str] = "epoch_end"):
        super().__init__(checkpoint_on=[], report_metrics_on=on, metrics=metrics)


__all__ = ["ReportCheckpointCallback", "TuneReportCallback", "TuneReportCheckpointCallback"]
