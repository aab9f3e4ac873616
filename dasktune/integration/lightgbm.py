"""LightGBM callbacks that report each boosting round to Tune and checkpoint the
booster (Ray's ``ray.tune.integration.lightgbm``).

Metric names are ``<valid set name>-<metric>``: ``valid_names=["eval"]`` with
``metric=["binary_error"]`` gives ``eval-binary_error``; under ``lgb.cv`` each metric
comes as ``valid-<metric>-mean`` and ``valid-<metric>-stdv``. Checkpoints hold the
booster saved by ``Booster.save_model`` (``model.txt`` unless ``filename`` says
otherwise), loadable with ``lightgbm.Booster(model_file=...)`` or
:meth:`TuneReportCheckpointCallback.get_model`.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightgbm import Booster
    from lightgbm.callback import CallbackEnv
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('dasktune.integration.lightgbm needs LightGBM: '
                      'pip install "dasktune[lightgbm]"') from exc

from dasktune.checkpoint import Checkpoint
from dasktune.integration._report import BoostingReport, Metrics, PostProcess, report_checkpoint
from dasktune.session import report


class TuneReportCheckpointCallback(BoostingReport):
    """Report LightGBM's eval metrics after every round; checkpoint the booster every
    ``frequency`` rounds (0: never during training) and after the last round.

    Args:
        metrics: the metrics to report: a LightGBM name (``"eval-binary_error"``), a
            list of them, or ``{reported_name: lightgbm_name}``; all of them when None.
        filename: the booster's file name in the checkpoint.
        frequency: checkpoint every this many rounds (rounds 1-based); 0 disables it.
        checkpoint_at_end: checkpoint after the last round (``num_boost_round``).
        results_postprocessing_fn: turns the dict about to be reported into the one
            reported.
    """

    CHECKPOINT_NAME = "model.txt"

    def __init__(self, metrics: Metrics = None, filename: str = CHECKPOINT_NAME,
                 frequency: int = 0, checkpoint_at_end: bool = True,
                 results_postprocessing_fn: PostProcess | None = None):
        super().__init__(metrics, filename, frequency, checkpoint_at_end,
                         results_postprocessing_fn)

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The booster a checkpoint of this callback holds."""
        with checkpoint.as_directory() as folder:
            return Booster(model_file=os.path.join(folder, filename))

    @staticmethod
    def _eval_result(env: CallbackEnv) -> dict[str, Any]:
        """LightGBM's ``evaluation_result_list`` as ``{"<set>-<metric>": value}``."""
        out: dict[str, Any] = {}
        for entry in env.evaluation_result_list:
            data_name, eval_name, value = entry[:3]
            if len(entry) > 4:  # lgb.cv: (set, metric, mean, higher_better, stdv)
                out[f"{data_name}-{eval_name}-mean"] = value
                out[f"{data_name}-{eval_name}-stdv"] = entry[4]
            else:
                out[f"{data_name}-{eval_name}"] = value
        return out

    def __call__(self, env: CallbackEnv) -> None:
        metrics = self._report_dict(self._eval_result(env))
        last = env.iteration == env.end_iteration - 1
        if (last and self._checkpoint_at_end) or self._checkpoint_due(env.iteration):
            report_checkpoint(metrics, lambda folder: env.model.save_model(
                os.path.join(folder, self._filename)))
        else:
            report(metrics)


class TuneReportCallback(TuneReportCheckpointCallback):
    """Report LightGBM's eval metrics after every round, without checkpoints.

    Ray 2.60 removed this class (its constructor raises); dasktune keeps the older
    scripts that use it working.
    """

    def __init__(self, metrics: Metrics = None,
                 results_postprocessing_fn: PostProcess | None = None):
        super().__init__(metrics=metrics, frequency=0, checkpoint_at_end=False,
                         results_postprocessing_fn=results_postprocessing_fn)


__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback"]
