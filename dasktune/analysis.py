"""``ExperimentAnalysis``: a finished (or running) experiment read back from its folder or URI.

Ray's legacy analysis object, what ``tune.run`` returns and what most answers found
online use (``analysis.best_config``, ``analysis.dataframe()``...). It reads the
experiment's ``experiment_state.json`` and each trial's ``result.json`` (or
``progress.csv``) from local or remote storage, on any machine: no cluster and no
trainable are needed. Ranking trials and their checkpoints is ``ResultGrid``'s job;
this class asks it and answers in Ray's shape (``None`` and a warning, where Ray gives
them, rather than an error).
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import TYPE_CHECKING, Any

import fsspec

from dasktune.experiment import read_state
from dasktune.logger import flatten_dict
from dasktune.metric_mode import MODES
from dasktune.result import DEFAULT_METRIC, TRAINING_ITERATION
from dasktune.results import MetricNotFoundError, ResultGrid, read_result_json, result_from_trial
from dasktune.storage import STATE_FILE, ExperimentStorage
from dasktune.trial import Trial

if TYPE_CHECKING:
    import pandas as pd

    from dasktune.checkpoint import Checkpoint

logger = logging.getLogger(__name__)


class ExperimentAnalysis:
    """Analyze the results of an experiment (Ray's ``tune.ExperimentAnalysis``).

    Args:
        experiment_checkpoint_path: the experiment's folder or URI (``s3://bucket/exp``),
            or its ``experiment_state.json``.
        storage_filesystem: an fsspec (or pyarrow) filesystem for that path.
        trials: the trials, if already at hand (``tune.run`` passes none; they are read).
        default_metric, default_mode: what ``best_*`` rank by. When not given, the
            experiment's own ``metric``/``mode`` (from ``tune.run`` or ``TuneConfig``) are
            used; only a mode means Ray's anonymous metric ``"_metric"``.
        storage_options: keyword arguments for the filesystem (e.g. an S3 endpoint),
            as in ``RunConfig``.
    """

    def __init__(self, experiment_checkpoint_path: str | os.PathLike[str], *,
                 storage_filesystem: Any = None, trials: list[Trial] | None = None,
                 default_metric: str | None = None, default_mode: str | None = None,
                 storage_options: dict[str, Any] | None = None):
        if default_mode and default_mode not in MODES:
            raise ValueError("`default_mode` has to be None or one of [min, max]")
        path = os.fspath(experiment_checkpoint_path)
        if storage_filesystem is not None:  # a path on that filesystem, its scheme dropped
            path = fsspec.core.split_protocol(path)[1]
        if path.endswith(".json"):
            path = path.rsplit("/", 1)[0]
        self._storage = ExperimentStorage.from_experiment_path(
            path, filesystem=storage_filesystem, storage_options=storage_options)
        state: dict[str, Any] = {}
        if trials is None:
            if not self._storage.exists(self._storage.path(STATE_FILE)):
                raise ValueError(
                    f"No experiment snapshot file of form '{STATE_FILE}' was found at: "
                    f"{self._storage.uri}\nPlease check if you specified the correct "
                    "experiment path, which should be a combination of the `storage_path` "
                    "and `name` specified in your run."
                )
            state = read_state(self._storage)
            trials = [_relocated(Trial.from_state(t), self._storage) for t in state["trials"]]
        self.trials: list[Trial] = list(trials)
        saved_metric, saved_mode = state.get("metric"), state.get("mode")
        self.default_metric = default_metric or (
            saved_metric if isinstance(saved_metric, str) and not default_mode else None)
        self.default_mode = default_mode or (
            saved_mode if isinstance(saved_mode, str) else None)
        if self.default_metric is None and self.default_mode is not None:
            self.default_metric = DEFAULT_METRIC  # Ray: a mode alone ranks "_metric"
        self._grid = ResultGrid(self.trials, self._storage)
        self._trial_dataframes: dict[str, pd.DataFrame] | None = None

    # ------------------------------------------------------------------ where
    @property
    def experiment_path(self) -> str:
        """The experiment's folder (a URI for remote storage)."""
        return self._storage.uri

    # ------------------------------------------------------------------ best
    def _defaults(self, what: str, alternative: str) -> tuple[str, str]:
        if not self.default_metric or not self.default_mode:
            raise ValueError(
                f"To fetch the `{what}`, pass a `metric` and `mode` parameter to "
                f"`tune.run()`. Alternatively, use the `{alternative}` method to set the "
                "metric and mode explicitly."
            )
        return self.default_metric, self.default_mode

    @property
    def best_trial(self) -> Trial | None:
        """The best trial by the default metric and mode (last result of each trial)."""
        return self.get_best_trial(*self._defaults("best_trial", "get_best_trial(metric, mode)"))

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The config of :attr:`best_trial`."""
        return self.get_best_config(
            *self._defaults("best_config", "get_best_config(metric, mode)"))

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        """The best checkpoint of :attr:`best_trial`, by the default metric and mode."""
        metric, mode = self._defaults("best_checkpoint", "get_best_checkpoint(trial, metric, mode)")
        trial = self.best_trial
        if trial is None:
            raise ValueError(
                f"No best trial found. Please check if you specified the correct default "
                f"metric ({metric}) and mode ({mode})."
            )
        return self.get_best_checkpoint(trial, metric, mode)

    @property
    def best_logdir(self) -> str | None:
        """The folder of :attr:`best_trial` (Ray's pre-2.7 name, kept for old scripts)."""
        trial = self.best_trial
        return trial.path if trial is not None else None

    @property
    def best_dataframe(self) -> pd.DataFrame:
        """Every result of :attr:`best_trial`."""
        self._defaults("best_dataframe", "get_best_trial(metric, mode)")
        trial = self.best_trial
        if trial is None:
            raise ValueError("No best trial found: no trial reported the default metric")
        return self.trial_dataframes[trial.trial_id]

    @property
    def best_result(self) -> dict[str, Any]:
        """The last result of :attr:`best_trial`."""
        self._defaults("best_result", "get_best_trial(metric, mode).last_result")
        trial = self.best_trial
        return trial.last_result if trial is not None else {}

    @property
    def best_result_df(self) -> pd.DataFrame:
        """:attr:`best_result` as a one-row DataFrame indexed by ``trial_id``."""
        import pandas as pd

        return pd.DataFrame.from_records([flatten_dict(self.best_result)], index="trial_id")

    def get_best_trial(self, metric: str | None = None, mode: str | None = None,
                       scope: str = "last", filter_nan_and_inf: bool = True) -> Trial | None:
        """The best trial by ``metric`` (``scope``: ``last``, ``avg``, ``last-5-avg``,
        ``last-10-avg`` or ``all``), or None (with a warning) if no trial has it."""
        if len(self.trials) == 1:
            return self.trials[0]
        metric, mode = self._validate_metric(metric), self._validate_mode(mode)
        try:
            best = self._grid.get_best_result(metric, mode, scope=scope,
                                              filter_nan_and_inf=filter_nan_and_inf)
        except (MetricNotFoundError, RuntimeError):
            logger.warning("Could not find best trial. Did you pass the correct `metric` "
                           "parameter?")
            return None
        return next(t for t, result in zip(self.trials, self._grid) if result is best)

    def get_best_config(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last") -> dict[str, Any] | None:
        """The config of :meth:`get_best_trial`, or None."""
        trial = self.get_best_trial(metric, mode, scope)
        return trial.config if trial is not None else None

    def get_best_logdir(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last") -> str | None:
        """The folder of :meth:`get_best_trial` (Ray's pre-2.7 name), or None."""
        trial = self.get_best_trial(metric, mode, scope)
        return trial.path if trial is not None else None

    def get_best_checkpoint(self, trial: Trial, metric: str | None = None,
                            mode: str | None = None) -> Checkpoint | None:
        """The kept checkpoint of ``trial`` with the best ``metric`` (the metrics it was
        reported with; ``training_iteration`` by default), or None if it has none."""
        metric = metric or self.default_metric or TRAINING_ITERATION
        mode = self._validate_mode(mode)
        scored = []
        for checkpoint, metrics in result_from_trial(trial, self._storage).best_checkpoints:
            value = _lookup(metrics, metric)
            if isinstance(value, (int, float)) and value == value:  # NaNs never win
                scored.append((value, checkpoint))
        if not scored:
            logger.error("No checkpoints have been found for trial %s.", trial)
            return None
        pick = min if mode == "min" else max
        return pick(scored, key=lambda item: item[0])[1]

    def get_last_checkpoint(self, trial: Trial | None = None,
                            metric: str = TRAINING_ITERATION,
                            mode: str = "max") -> Checkpoint | None:
        """The newest checkpoint of ``trial`` (default: the best trial by ``metric``)."""
        trial = trial or self.get_best_trial(metric, mode)
        if trial is None:
            return None
        return self.get_best_checkpoint(trial, TRAINING_ITERATION, "max")

    # ------------------------------------------------------------------ all trials
    def get_all_configs(self, prefix: bool = False) -> dict[str, dict[str, Any]]:
        """``{trial_id: config}`` (flattened, ``config/``-prefixed keys with ``prefix``)."""
        return {t.trial_id: flatten_dict({"config": t.config}) if prefix else t.config
                for t in self.trials}

    @property
    def results(self) -> dict[str, dict[str, Any]]:
        """``{trial_id: last result}``."""
        return {t.trial_id: t.last_result for t in self.trials}

    @property
    def results_df(self) -> pd.DataFrame:
        """Every trial's last result, flattened, indexed by ``trial_id``."""
        import pandas as pd

        rows = [flatten_dict(dict(t.last_result, trial_id=t.trial_id)) for t in self.trials]
        return pd.DataFrame.from_records(rows, index="trial_id")

    @property
    def trial_dataframes(self) -> dict[str, pd.DataFrame]:
        """``{trial_id: DataFrame}`` of every result of each trial (read once)."""
        if self._trial_dataframes is None:
            self._trial_dataframes = {t.trial_id: self._trial_dataframe(t)
                                      for t in self.trials}
        return self._trial_dataframes

    def dataframe(self, metric: str | None = None, mode: str | None = None) -> pd.DataFrame:
        """One row per trial with its ``config/`` columns: its result with the best
        ``metric`` ever seen by ``mode``, or its last result without a mode."""
        if mode and mode not in MODES:
            raise ValueError("If set, `mode` has to be one of [min, max]")
        if mode and not metric:
            raise ValueError("If a `mode` is passed to `ExperimentAnalysis.dataframe(), "
                             "you'll also have to pass a `metric`!")
        if mode:
            return self._grid.get_dataframe(filter_metric=metric, filter_mode=mode)
        return self._grid.get_dataframe()

    # ------------------------------------------------------------------ helpers
    def _trial_dataframe(self, trial: Trial) -> pd.DataFrame:
        import pandas as pd

        if not trial.last_result or not trial.path:
            return pd.DataFrame()
        rows = read_result_json(self._storage.fs, trial.path)
        if rows:
            return pd.json_normalize(rows, sep="/")
        frame = result_from_trial(trial, self._storage).metrics_dataframe  # progress.csv
        return frame if frame is not None else pd.DataFrame()

    def _validate_metric(self, metric: str | None) -> str:
        if not metric and not self.default_metric:
            raise ValueError("No `metric` has been passed and `default_metric` has not been "
                             "set. Please specify the `metric` parameter.")
        return metric or self.default_metric  # type: ignore[return-value]

    def _validate_mode(self, mode: str | None) -> str:
        if not mode and not self.default_mode:
            raise ValueError("No `mode` has been passed and `default_mode` has not been set. "
                             "Please specify the `mode` parameter.")
        if mode and mode not in MODES:
            raise ValueError("If set, `mode` has to be one of [min, max]")
        return mode or self.default_mode  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"ExperimentAnalysis({self.experiment_path!r}, {len(self.trials)} trials)"


def _lookup(metrics: dict[str, Any], key: str) -> Any:
    """``metrics[key]``, where ``key`` may name a nested value as ``"a/b"`` (as Ray)."""
    if key in metrics:
        return metrics[key]
    return flatten_dict(metrics).get(key)


def _relocated(trial: Trial, storage: ExperimentStorage) -> Trial:
    """The trial with its paths under the experiment's present location (it may have been
    copied elsewhere since it ran, e.g. uploaded to a bucket)."""
    old = trial.path
    if not old:
        return trial
    new = storage.path(posixpath.basename(old.rstrip("/")))
    if new == old:
        return trial

    def move(path: str | None) -> str | None:
        return new + path[len(old):] if path and path.startswith(old) else path

    trial.path = new
    trial.checkpoint = move(trial.checkpoint)
    trial.restore_path = move(trial.restore_path)
    trial.checkpoints = [dict(c, path=move(c.get("path"))) for c in trial.checkpoints]
    return trial
