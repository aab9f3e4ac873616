"""Ray's progress reporters: ``tune.ProgressReporter``, ``tune.CLIReporter``,
``tune.JupyterNotebookReporter``, passed as ``RunConfig(progress_reporter=...)``.

The controller drives every reporter through two calls, ``maybe_report(trials, status,
total=...)`` each loop and ``final(trials)`` at the end. :class:`ProgressReporter` turns
them into Ray's ``should_report(trials, done)`` / ``report(trials, done, *sys_info)``, so a
Ray user's own subclass runs unchanged. The built-in reporters draw dasktune's table
(:mod:`dasktune.progress`) with Ray's column, row and frequency options.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dasktune import progress
from dasktune.metric_mode import check_mode

if TYPE_CHECKING:
    from dasktune.trial import Trial

__all__ = ["CLIReporter", "JupyterNotebookReporter", "ProgressReporter"]

Columns = Sequence[str] | Mapping[str, str] | None


class ProgressReporter:
    """Ray's ``tune.ProgressReporter`` base: subclass it and implement
    :meth:`should_report` and :meth:`report`.

    ``verbose`` is 0 when ``RunConfig(verbose=0)`` silenced the reporter.
    """

    verbose: int = 2

    def should_report(self, trials: list[Trial], done: bool = False) -> bool:
        """Whether to report now (``done``: the experiment has ended)."""
        raise NotImplementedError

    def report(self, trials: list[Trial], done: bool, *sys_info: str) -> None:
        """Show the progress of ``trials``; ``sys_info`` are status strings."""
        raise NotImplementedError

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        """Learn the tuned metric and mode (Ray's hook); False if they conflict."""
        return True

    def set_total_samples(self, total_samples: int | None) -> None:
        """Learn how many trials the experiment will run, when known."""

    def setup(self, start_time: float | None = None, total_samples: int | None = None,
              metric: str | None = None, mode: str | None = None, **kwargs: Any) -> None:
        """Ray's start-of-experiment hook: records the metric, mode and total."""
        self.set_search_properties(metric, mode)
        self.set_total_samples(total_samples)

    # --- the controller's side ---------------------------------------------------------
    def maybe_report(self, trials: list[Trial], status: str = "", total: int | None = None
                     ) -> None:
        """Called each loop: report if :meth:`should_report` says so."""
        if total is not None:
            self.set_total_samples(total)
        if self.verbose == 0:
            return
        if self.should_report(trials, done=False):
            self.report(trials, False, *([status] if status else []))

    def final(self, trials: list[Trial]) -> None:
        """Called once at the end: always reports (Ray's ``done=True``)."""
        if self.verbose == 0:
            return
        if self.should_report(trials, done=True):
            self.report(trials, True, "finished")


class CLIReporter(ProgressReporter):
    """The trial table as plain text on stdout (Ray's ``tune.CLIReporter``).

    ``metric_columns`` / ``parameter_columns``: a list of result / config keys, or a dict
    key -> header (``"a/b"`` reaches a nested value); by default the tuned metric and no
    config columns. At most ``max_progress_rows`` trials are listed, a table at most every
    ``max_report_frequency`` seconds; ``sort_by_metric=True`` lists the best trial first
    (needs ``metric``/``mode``, here or in ``TuneConfig``). ``max_error_rows``,
    ``max_column_length``, ``infer_limit`` and ``print_intermediate_tables`` are accepted
    for Ray compatibility and change nothing.
    """

    def __init__(
        self,
        metric_columns: Columns = None,
        parameter_columns: Columns = None,
        total_samples: int | None = None,
        max_progress_rows: int = 20,
        max_error_rows: int = 20,
        max_column_length: int = 20,
        max_report_frequency: float = 5,
        infer_limit: int = 3,
        print_intermediate_tables: bool | None = None,
        metric: str | None = None,
        mode: str | None = None,
        sort_by_metric: bool = False,
    ) -> None:
        check_mode(mode, type(self).__name__)
        if isinstance(max_progress_rows, bool) or not isinstance(max_progress_rows, int) \
                or max_progress_rows < 1:
            raise ValueError(f"{type(self).__name__}: max_progress_rows must be an int >= 1, "
                             f"got {max_progress_rows!r}")
        if not isinstance(max_report_frequency, (int, float)) or max_report_frequency < 0:
            raise ValueError(f"{type(self).__name__}: max_report_frequency must be a number "
                             f">= 0, got {max_report_frequency!r}")
        self.max_report_frequency = float(max_report_frequency)
        self._table = progress.ProgressReporter(
            verbose=2, metric=metric, mode=mode, max_rows=max_progress_rows,
            period=self.max_report_frequency, metric_columns=metric_columns,
            parameter_columns=parameter_columns, sort_by_metric=sort_by_metric)
        self._table._display = self._display_target()
        self._table.total = total_samples
        self._last_report = float("-inf")  # the first loop reports at once

    def _display_target(self) -> Any:
        return None  # plain text, even inside Jupyter, as Ray's CLIReporter

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table._display = self._display_target()

    @property
    def metric(self) -> str | None:
        """The metric the table sorts by and marks the best trial of."""
        return self._table.metric

    @property
    def mode(self) -> str | None:
        """``"min"`` or ``"max"``."""
        return self._table.mode

    @property
    def out(self) -> Any:
        """The stream the table is written to (stdout)."""
        return self._table.out

    @out.setter
    def out(self, stream: Any) -> None:
        self._table.out = stream

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        """Take the tuned metric and mode unless given to the reporter (Ray's rule)."""
        if (self._table.metric and metric and metric != self._table.metric) or \
                (self._table.mode and mode and mode != self._table.mode):
            return False
        self._table.metric = self._table.metric or (metric if isinstance(metric, str) else None)
        self._table.mode = self._table.mode or (mode if isinstance(mode, str) else None)
        return True

    def set_total_samples(self, total_samples: int | None) -> None:
        if total_samples is not None:
            self._table.total = total_samples

    def add_metric_column(self, metric: str, representation: str | None = None) -> None:
        """Show the result key ``metric`` (headed ``representation``) in the table."""
        columns = self._table.metric_columns
        if columns is None:  # the table showed the tuned metric: keep it
            columns = {self._table.metric: self._table.metric} if self._table.metric else {}
        if metric in columns:
            raise ValueError(f"column {metric!r} is already in the table")
        columns[metric] = representation or metric
        self._table.metric_columns = columns

    def add_parameter_column(self, parameter: str, representation: str | None = None) -> None:
        """Show the config key ``parameter`` (headed ``representation``) in the table."""
        columns = self._table.parameter_columns or {}
        if parameter in columns:
            raise ValueError(f"column {parameter!r} is already in the table")
        columns[parameter] = representation or parameter
        self._table.parameter_columns = columns

    def should_report(self, trials: list[Trial], done: bool = False) -> bool:
        now = time.monotonic()
        if done or now - self._last_report >= self.max_report_frequency:
            self._last_report = now
            return True
        return False

    def report(self, trials: list[Trial], done: bool, *sys_info: str) -> None:
        self._table._emit(self._table.render(trials, " | ".join(sys_info)))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(metric={self.metric!r}, mode={self.mode!r}, "
                f"max_progress_rows={self._table.max_rows})")


class JupyterNotebookReporter(CLIReporter):
    """The trial table in a Jupyter output (Ray's ``tune.JupyterNotebookReporter``).

    ``overwrite=True`` updates one output in place; ``False`` adds a new output each
    time. Outside a notebook it prints plain text, like :class:`CLIReporter`. Other
    arguments are :class:`CLIReporter`'s.
    """

    def __init__(self, overwrite: bool = True, **kwargs: Any) -> None:
        self.overwrite = overwrite
        super().__init__(**kwargs)

    def _display_target(self) -> Any:
        return progress.jupyter_display()

    def report(self, trials: list[Trial], done: bool, *sys_info: str) -> None:
        if not self.overwrite and self._table._display is not None:
            self._table._display = True  # True: the next table opens a new output
        super().report(trials, done, *sys_info)
