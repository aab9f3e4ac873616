"""XGBoost callbacks that report each boosting round to Tune and checkpoint the booster
(Ray's ``ray.tune.integration.xgboost``).

Metric names are XGBoost's eval log flattened with ``-``: ``evals=[(dtest, "test")]``
with ``eval_metric=["logloss", "error"]`` gives ``test-logloss`` and ``test-error``.
Checkpoints hold the booster saved by ``Booster.save_model`` (``model.ubj`` unless
``filename`` says otherwise), loadable with XGBoost's own ``Booster.load_model`` or
:meth:`TuneReportCheckpointCallback.get_model`.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from xgboost import Booster
    from xgboost.callback import TrainingCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('dasktune.integration.xgboost needs XGBoost: '
                      'pip install "dasktune[xgboost]"') from exc

from dasktune.checkpoint import Checkpoint
from dasktune.integration._report import BoostingReport, Metrics, PostProcess, report_checkpoint
from dasktune.logger import flatten_dict
from dasktune.session import report


class TuneReportCheckpointCallback(BoostingReport, TrainingCallback):
    """Report XGBoost's eval metrics after every round; checkpoint the booster every
    ``frequency`` rounds (0: never during training) and at the end of training.

    Args:
        metrics: the metrics to report: an XGBoost name (``"test-logloss"``), a list
            of them, or ``{reported_name: xgboost_name}``; all of them when None.
        filename: the booster's file name in the checkpoint.
        frequency: checkpoint every this many rounds (rounds 1-based: ``frequency=2``
            checkpoints after the 2nd, 4th, ... round); 0 disables it.
        checkpoint_at_end: also checkpoint after the last round (once: not again if
            the last round was a ``frequency`` checkpoint), with its metrics.
        results_postprocessing_fn: turns the dict about to be reported into the one
            reported (e.g. averages ``xgb.cv``'s ``(mean, std)`` pairs).
    """

    CHECKPOINT_NAME = "model.ubj"

    def __init__(self, metrics: Metrics = None, filename: str = CHECKPOINT_NAME,
                 frequency: int = 0, checkpoint_at_end: bool = True,
                 results_postprocessing_fn: PostProcess | None = None):
        super().__init__(metrics, filename, frequency, checkpoint_at_end,
                         results_postprocessing_fn)
        self._evals_log: dict[str, Any] | None = None
        self._last_checkpoint_round: int | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The booster a checkpoint of this callback holds."""
        with checkpoint.as_directory() as folder:
            booster = Booster()
            booster.load_model(os.path.join(folder, filename))
            return booster

    @staticmethod
    def _latest(evals_log: dict[str, Any]) -> dict[str, Any]:
        """XGBoost's eval log as ``{"<set>-<metric>": value of the last round}``."""
        return {k: v[-1] for k, v in flatten_dict(evals_log, delimiter="-").items()}

    def _checkpoint(self, metrics: dict[str, Any], model: Booster) -> None:
        report_checkpoint(metrics, lambda folder: model.save_model(
            os.path.join(folder, self._filename)))

    def after_iteration(self, model: Booster, epoch: int, evals_log: dict[str, Any]) -> bool:
        self._evals_log = evals_log
        metrics = self._report_dict(self._latest(evals_log))
        if self._checkpoint_due(epoch):
            self._last_checkpoint_round = epoch
            self._checkpoint(metrics, model)
        else:
            report(metrics)
        return False  # never asks XGBoost to stop: Tune stops a trial through report

    def after_training(self, model: Booster) -> Booster:
        if not self._checkpoint_at_end:
            return model
        if self._last_checkpoint_round is not None and \
                model.num_boosted_rounds() - 1 == self._last_checkpoint_round:
            return model  # the last round was checkpointed already
        metrics = self._report_dict(self._latest(self._evals_log)) if self._evals_log else {}
        self._checkpoint(metrics, model)
        return model


class TuneReportCallback(TuneReportCheckpointCallback):
    """Report XGBoost's eval metrics after every round, without checkpoints.

    Ray 2.60 removed this class (its constructor raises); dasktune keeps the older
    scripts that use it working.
    """

    def __init__(self, metrics: Metrics = None,
                 results_postprocessing_fn: PostProcess | None = None):
        super().__init__(metrics=metrics, frequency=0, checkpoint_at_end=False,
                         results_postprocessing_fn=results_postprocessing_fn)


__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback"]
