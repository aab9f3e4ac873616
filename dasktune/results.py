"""``Result`` and ``ResultGrid``: what ``Tuner.fit()`` returns (Ray's ``ray.tune.ResultGrid``).

Both are built from the trials' records and read the per-trial files lazily from
storage, so they work from a remote experiment on a machine that did not run it.
"""

from __future__ import annotations

import io
import math
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dasktune.checkpoint import Checkpoint
from dasktune.logger import EXPR_PROGRESS_FILE, EXPR_RESULT_FILE, flatten_dict
from dasktune.metric_mode import check_mode
from dasktune.result import AUTO_RESULT_KEYS, reported_keys
from dasktune.trial import ERROR, TERMINATED, Trial
from dasktune.trial_notices import last_error_line

if TYPE_CHECKING:
    import fsspec
    import pandas as pd

    from dasktune.storage import ExperimentStorage

_SCOPES = ("all", "last", "avg", "last-5-avg", "last-10-avg")


class TuneError(Exception):
    """A trial failed (re-raised from ``fit()`` with ``fail_fast="raise"``)."""


class MetricNotFoundError(ValueError, RuntimeError):
    """``get_best_result`` was asked for a metric no trial reported.

    Ray raises ``RuntimeError`` here; earlier dasktune raised ``ValueError``: both
    ``except`` clauses catch it.
    """


@dataclass
class Result:
    """The outcome of one trial."""

    metrics: dict[str, Any]  # {} for a trial that never reported (as in Ray)
    checkpoint: Checkpoint | None
    error: Exception | None
    path: str
    filesystem: Any = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    _metrics_dataframe: Any = None
    _config: dict[str, Any] | None = None

    @property
    def config(self) -> dict[str, Any] | None:
        """The trial's config (also for a trial that failed before its first report)."""
        return (self.metrics or {}).get("config", self._config)

    @property
    def metrics_dataframe(self) -> pd.DataFrame | None:
        """Every reported result of the trial (read from its ``progress.csv``)."""
        if self._metrics_dataframe is None:
            self._metrics_dataframe = _read_progress(self.filesystem, self.path)
        return self._metrics_dataframe

    def __repr__(self) -> str:
        keys = ("training_iteration", "trial_id")
        shown = {k: v for k, v in (self.metrics or {}).items()
                 if k in keys or k not in AUTO_RESULT_KEYS and not isinstance(v, dict)}
        return (f"Result(metrics={shown}, path={self.path!r}, "
                f"checkpoint={self.checkpoint!r}, error={type(self.error).__name__ if self.error else None})")




def _read_progress(fs: fsspec.AbstractFileSystem | None, path: str) -> pd.DataFrame | None:
    import pandas as pd

    if fs is None:
        return None
    try:
        data = fs.cat_file(posixpath.join(path, EXPR_PROGRESS_FILE))
    except FileNotFoundError:
        return None
    if not data.strip():
        return pd.DataFrame()
    return pd.read_csv(io.BytesIO(data))


def result_from_trial(trial: Trial, storage: ExperimentStorage | None,
                      score_attr: str | None = None, score_order: str = "max") -> Result:
    fs = storage.fs if storage is not None else None
    checkpoint = Checkpoint(trial.checkpoint, fs) if trial.checkpoint and fs is not None else None
    best: list[tuple[Checkpoint, dict[str, Any]]] = []
    if fs is not None:
        for info in trial.checkpoints:
            best.append((Checkpoint(info["path"], fs), info.get("metrics", {})))
        if score_attr:
            def key(item: tuple[Checkpoint, dict[str, Any]]) -> float:
                v = item[1].get(score_attr)
                return float("-inf") if v is None else float(v)

            best.sort(key=key, reverse=(score_order == "max"))
    error = TuneError(trial.error_msg) if trial.status == ERROR and trial.error_msg else None
    metrics = dict(trial.last_result) if trial.last_result else {}
    if metrics:
        metrics.setdefault("config", trial.config)
    return Result(metrics=metrics, checkpoint=checkpoint, error=error,
                  path=trial.path or "", filesystem=fs, best_checkpoints=best,
                  _config=trial.config)


class ResultGrid:
    """The results of all trials of an experiment."""

    def __init__(self, trials: list[Trial], storage: ExperimentStorage | None = None,
                 metric: str | list[str] | None = None, mode: str | list[str] | None = None,
                 score_attr: str | None = None, score_order: str = "max"):
        self._trials = list(trials)
        self._storage = storage
        self._metric = metric
        self._mode = mode
        self._results = [result_from_trial(t, storage, score_attr, score_order) for t in trials]

    # -------------------------------------------------------------- sequence
    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} trials, {self.num_errors} errors>"

    # -------------------------------------------------------------- summary
    @property
    def experiment_path(self) -> str:
        """The experiment folder's path or URI."""
        return self._storage.uri if self._storage else ""

    @property
    def filesystem(self) -> Any:
        """The fsspec filesystem the experiment is stored on."""
        return self._storage.fs if self._storage else None

    @property
    def errors(self) -> list[Exception]:
        """The exceptions of the trials that ended in error."""
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        """How many trials ended in error."""
        return sum(1 for t in self._trials if t.status == ERROR)

    @property
    def num_terminated(self) -> int:
        """How many trials ended without an error."""
        return sum(1 for t in self._trials if t.status == TERMINATED)

    # -------------------------------------------------------------- best
    def get_best_result(self, metric: str | None = None, mode: str | None = None,
                        scope: str = "last", filter_nan_and_inf: bool = True) -> Result:
        """The trial with the best ``metric`` (Ray's semantics, incl. ``scope``)."""
        metric, mode = self._metric_mode(metric, mode)
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
        best_i, best_v = None, None
        seen_metric = False
        for i, trial in enumerate(self._trials):
            stats = trial.metric_analysis.get(metric)
            if stats is None:
                if metric in trial.last_result:
                    seen_metric = True
                continue
            seen_metric = True
            if scope == "all":
                value = stats["min"] if mode == "min" else stats["max"]
            else:
                value = stats["last" if scope == "last" else scope]
            if filter_nan_and_inf and (value is None or math.isnan(value) or math.isinf(value)):
                continue
            if best_v is None or (value < best_v if mode == "min" else value > best_v):
                best_i, best_v = i, value
        if best_i is None:
            if not seen_metric:
                reported = {k for t in self._trials for k in t.last_result}
                errors = [t.error_msg for t in self._trials if t.error_msg]
                if reported or not errors:
                    why = reported_keys(reported) if reported else "no trial reported a result"
                else:  # refused before it was recorded, e.g. by the missing-metric check
                    why = f"no result recorded; a trial's error: {last_error_line(errors[0])}"
                raise MetricNotFoundError(
                    f"get_best_result: no trial reported the metric {metric!r} ({why})")
            raise RuntimeError(
                f"get_best_result: every trial's {metric!r} is NaN/inf; pass "
                "filter_nan_and_inf=False to pick among them"
            )
        return self._results[best_i]

    def _metric_mode(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        if metric is None:
            metric = self._metric if isinstance(self._metric, str) else None
            if metric is None and isinstance(self._metric, (list, tuple)):
                raise ValueError("multi-objective experiment: pass metric= to pick an objective")
        if mode is None:
            if isinstance(self._mode, str):
                mode = self._mode
            elif isinstance(self._metric, (list, tuple)) and metric in self._metric:
                mode = self._mode[list(self._metric).index(metric)]  # type: ignore[index]
        if not metric or not mode:
            raise ValueError(
                "get_best_result needs a metric and a mode: pass them here or in TuneConfig"
            )
        check_mode(mode, "get_best_result", allow_none=False)
        return metric, mode

    # -------------------------------------------------------------- frames
    def get_dataframe(self, filter_metric: str | None = None,
                      filter_mode: str | None = None) -> pd.DataFrame:
        """One row per trial: its last result (or the best one by ``filter_metric``),
        with ``config/...`` columns."""
        import pandas as pd

        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("get_dataframe: give both filter_metric and filter_mode, or neither")
        rows = []
        for trial, result in zip(self._trials, self._results):
            row: dict[str, Any] | None = None
            if filter_metric:
                df = result.metrics_dataframe
                if df is not None and filter_metric in df.columns and len(df):
                    idx = df[filter_metric].idxmin() if filter_mode == "min" else \
                        df[filter_metric].idxmax()
                    row = df.loc[idx].to_dict()
            if row is None:
                row = flatten_dict({k: v for k, v in (trial.last_result or {}).items()
                                    if k != "config"})
            row.update({f"config/{k}": v for k, v in flatten_dict(trial.config).items()})
            row["trial_id"] = trial.trial_id
            row["logdir"] = trial.path
            rows.append(row)
        return pd.DataFrame(rows)


def read_result_json(fs: fsspec.AbstractFileSystem, trial_path: str) -> list[dict[str, Any]]:
    """All results of a trial from its ``result.json`` (for restore and tools)."""
    import json

    try:
        data = fs.cat_file(posixpath.join(trial_path, EXPR_RESULT_FILE))
    except FileNotFoundError:
        return []
    out = []
    for line in data.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:  # a torn last line from a killed driver
            break
    return out
