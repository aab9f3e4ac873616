"""What the training-library callbacks share: picking the metrics to report by Ray's
``metrics`` argument, the boosting callbacks' common settings, and reporting a checkpoint
written into a temporary folder."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from dasktune.checkpoint import Checkpoint
from dasktune.session import report

Metrics = str | list[str] | dict[str, str] | None


def normalize_metrics(metrics: Metrics) -> list[str] | dict[str, str] | None:
    """Ray's ``metrics`` argument: a name, a list of names, or ``{reported: library}``."""
    if metrics is None or isinstance(metrics, (list, dict)):
        if isinstance(metrics, dict) and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()):
            raise TypeError("metrics: a dict maps reported names to the library's names "
                            f"(both strings), got {metrics!r}")
        return metrics
    if isinstance(metrics, str):
        return [metrics]
    if isinstance(metrics, tuple):
        return list(metrics)
    raise TypeError(f"metrics must be a name, a list of names or a dict, got {metrics!r}")


def pick_metrics(metrics: list[str] | dict[str, str] | None,
                 available: Mapping[str, Any]) -> dict[str, Any]:
    """The values to report: every available one when ``metrics`` is empty, else the
    named ones (renamed by a dict). A name the library did not log is a ``KeyError``
    that lists the names it did log."""
    if not metrics:
        return dict(available)
    pairs = metrics.items() if isinstance(metrics, dict) else ((m, m) for m in metrics)
    out = {}
    for reported, name in pairs:
        if name not in available:
            raise KeyError(f"metric {name!r} was not logged; the logged ones are "
                           f"{sorted(available)}")
        out[reported] = available[name]
    return out


def report_checkpoint(metrics: dict[str, Any], write: Callable[[str], None]) -> None:
    """``tune.report(metrics)`` with a checkpoint of what ``write(folder)`` saves.

    ``tune.report`` returns once the checkpoint is committed to the experiment's
    storage, so the temporary folder can go right after.
    """
    with tempfile.TemporaryDirectory(prefix="dasktune-ckpt-") as folder:
        write(folder)
        report(metrics, checkpoint=Checkpoint.from_directory(folder))


PostProcess = Callable[[dict[str, Any]], dict[str, Any]]


class BoostingReport:
    """Ray's arguments of the XGBoost and LightGBM ``TuneReportCheckpointCallback``
    (checked once, here) and how a round's metrics become the dict reported.

    A base of both callbacks; it calls ``super().__init__()`` so a library base class
    that comes after it (XGBoost's ``TrainingCallback``) is initialised too.
    """

    def __init__(self, metrics: Metrics, filename: str, frequency: int,
                 checkpoint_at_end: bool, results_postprocessing_fn: PostProcess | None):
        if not isinstance(frequency, int) or frequency < 0:
            raise ValueError(f"frequency must be an integer >= 0, got {frequency!r}")
        super().__init__()
        self._metrics = normalize_metrics(metrics)
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._results_postprocessing_fn = results_postprocessing_fn

    def _report_dict(self, latest: Mapping[str, Any]) -> dict[str, Any]:
        """The metrics to report from ``latest`` (every metric of the round by name)."""
        out = pick_metrics(self._metrics, latest)
        if self._results_postprocessing_fn is not None:
            out = self._results_postprocessing_fn(out)
        return out

    def _checkpoint_due(self, round_index: int) -> bool:
        """Whether the round ``round_index`` (0-based) is a ``frequency`` checkpoint."""
        return bool(self._frequency) and (round_index + 1) % self._frequency == 0
