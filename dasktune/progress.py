"""The console progress table: compact, rate-limited, readable with hundreds of trials.

One line per trial at most, sorted by the metric (best first), capped with a
"+N more" line; a summary line with trial counts and the best so far. Plain text
(no control characters) when stdout is not a terminal, so logs and pipes stay clean;
in Jupyter, one output cell that updates in place.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from dasktune import _dask_config
from dasktune.logger import flatten_dict
from dasktune.metric_mode import MODES
from dasktune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED

if TYPE_CHECKING:
    from dasktune.trial import Trial

_ORDER = (RUNNING, PENDING, PAUSED, TERMINATED, ERROR)


class ProgressReporter:
    """Prints the trial table every ``dasktune.controller.report-period`` seconds.

    ``verbose``: 0 silent, 1 summary line only, 2 table, 3 table with configs.
    ``metric_columns`` / ``parameter_columns`` (Ray's: a list of keys, or a dict key ->
    header; ``"a/b"`` reaches nested values) choose the table's columns; by default it
    shows the tuned metric, and the configs at verbose 3. ``sort_by_metric=False`` lists
    trials by status instead of best first.
    """

    def __init__(self, verbose: int = 1, metric: str | None = None, mode: str | None = None,
                 max_rows: int = 20, out: IO[str] | None = None, period: float | None = None,
                 metric_columns: Sequence[str] | Mapping[str, str] | None = None,
                 parameter_columns: Sequence[str] | Mapping[str, str] | None = None,
                 sort_by_metric: bool = True):
        self.verbose = verbose
        self.metric = metric
        self.mode = mode
        self.max_rows = max_rows
        # key -> header; None: the tuned metric only / configs only at verbose 3
        self.metric_columns = _columns(metric_columns, "metric_columns")
        self.parameter_columns = _columns(parameter_columns, "parameter_columns")
        self.sort_by_metric = sort_by_metric
        self.out = out or sys.stdout
        self.period = _dask_config.get_seconds("controller.report-period") if period is None \
            else period
        self._last = float("-inf")  # the first call reports, however young the clock
        self._start = time.monotonic()
        # In a Jupyter kernel the table is one output that updates in place.
        self._display: Any = jupyter_display() if out is None else None

    total: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # tuner.pkl keeps the run config: the stream and the Jupyter output stay behind
        state = dict(self.__dict__)
        state.pop("out", None)
        state.pop("_display", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.out = sys.stdout
        self._display = jupyter_display()

    def _emit(self, text: str) -> None:
        if self._display is not None:
            from IPython.display import Pretty

            if self._display is True:  # first table: create the output it will update
                from IPython.display import display

                self._display = display(Pretty(text), display_id=True)
            else:
                self._display.update(Pretty(text))
            return
        self.out.write(text + "\n")
        self.out.flush()

    @property
    def _tty(self) -> bool:
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty())

    def maybe_report(self, trials: list[Trial], status: str = "", total: int | None = None
                     ) -> None:
        now = time.monotonic()
        if total is not None:
            self.total = total
        if self.verbose == 0 or now - self._last < self.period:
            return
        self._last = now
        self._emit(self.render(trials, status))

    def final(self, trials: list[Trial]) -> None:
        if self.verbose == 0:
            return
        self._emit(self.render(trials, "finished"))

    def progress_bar(self, trials: list[Trial], width: int = 20) -> str:
        """``[#####-----] 12/40 trials, ETA 1m30s`` when the total is known, else ''."""
        total = self.total
        if not total:
            return ""
        done = sum(1 for t in trials if t.is_finished)
        filled = int(width * done / total)
        bar = "#" * filled + "-" * (width - filled)
        elapsed = time.monotonic() - self._start
        eta = ""
        if 0 < done < total:
            left = elapsed / done * (total - done)
            eta = f", ETA {_duration(left)}"
        return f"[{bar}] {done}/{total} trials{eta}"

    # ------------------------------------------------------------ rendering
    def _value(self, trial: Trial) -> float | None:
        if not self.metric:
            return None
        v = trial.last_result.get(self.metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            return float(v)
        return None

    def _best(self, trials: list[Trial]) -> Trial | None:
        scored = [t for t in trials if self._value(t) is not None]
        if not scored or self.mode not in MODES:
            return None
        key = self._value
        return min(scored, key=key) if self.mode == "min" else max(scored, key=key)  # type: ignore[arg-type,return-value]

    def render(self, trials: list[Trial], status: str = "") -> str:
        counts = Counter(t.status for t in trials)
        elapsed = time.monotonic() - self._start
        parts = [f"{counts[s]} {s}" for s in _ORDER if counts[s]]
        head = f"== dasktune: {len(trials)} trials ({', '.join(parts) or 'none yet'}) " \
               f"| {elapsed:.0f}s elapsed"
        best = self._best(trials)
        if best is not None:
            head += f" | best {self.metric}={self._value(best):.6g} ({best.trial_id})"
        if status:
            head += f" | {status}"
        bar = self.progress_bar(trials)
        if bar:
            head += f"\n{bar}"
        if self.verbose < 2:
            return head
        rows = sorted(trials, key=self._sort_key)
        lines = [head]
        shown = rows[: self.max_rows]
        # Ray's default: a column per sampled hyperparameter (the trials' evaluated_params).
        params = self.parameter_columns if self.parameter_columns is not None \
            else _evaluated_columns(shown)
        metrics = self.metric_columns
        cols = ["trial", "status", *(_cell(h) for h in params.values()), "iter",
                *(metrics.values() if metrics is not None else [self.metric or ""]), "worker"]
        with_config = self.verbose >= 3 and self.parameter_columns is None
        if with_config:
            cols.append("config")
        table = [cols]
        for t in shown:
            if metrics is None:
                v = self._value(t)
                values = ["" if v is None else f"{v:.6g}"]
            else:
                values = [_cell(_lookup(t.last_result, k)) for k in metrics]
            row = [("* " if t is best else "  ") + t.trial_id, t.status,
                   *(_cell(_param(t, k)) for k in params),
                   str(t.last_result.get("training_iteration", "")), *values,
                   t.placements[-1].host if t.placements else ""]
            if with_config:
                row.append(_short_config(t.config))
            table.append(row)
        widths = [max(len(r[i]) for r in table) for i in range(len(cols))]
        for i, r in enumerate(table):
            line = "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            if self._tty and i > 0 and shown[i - 1] is best:
                line = f"\033[1m{line}\033[0m"  # bold on a terminal only
            lines.append(line)
        if len(rows) > len(shown):
            lines.append(f"  +{len(rows) - len(shown)} more")
        return "\n".join(lines)

    def _sort_key(self, t: Trial) -> tuple[Any, ...]:
        v = self._value(t) if self.sort_by_metric else None
        if v is None:
            return (1, _ORDER.index(t.status), t.trial_id)
        return (0, v if self.mode != "max" else -v, t.trial_id)


def _columns(columns: Sequence[str] | Mapping[str, str] | None, what: str
             ) -> dict[str, str] | None:
    """Ray's column argument (a list of keys, or a dict key -> header) as key -> header."""
    if columns is None:
        return None
    if isinstance(columns, Mapping):
        return {str(k): str(v) for k, v in columns.items()}
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise TypeError(f"{what} must be a list of names or a dict name -> header, "
                        f"got {columns!r}")
    return {str(k): str(k) for k in columns}


def _evaluated_columns(trials: Sequence[Trial]) -> dict[str, str]:
    """key -> header for every hyperparameter the searcher chose for these trials."""
    keys: dict[str, None] = {}
    for t in trials:
        keys.update(dict.fromkeys(flatten_dict(t.evaluated_params or {}, delimiter="/")))
    return {k: k for k in keys}


def _param(trial: Trial, key: str) -> Any:
    value = _lookup(trial.evaluated_params or {}, key)
    return _lookup(trial.config, key) if value is None else value


def _lookup(values: Mapping[str, Any], key: str) -> Any:
    """``values[key]``, where ``"a/b"`` reaches into nested dicts as Ray's columns do."""
    if key in values:
        return values[key]
    node: Any = values
    for part in key.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 20 else text[:17] + "..."


def _short_config(config: dict[str, Any], limit: int = 60) -> str:
    text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in config.items() if not isinstance(v, dict))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def jupyter_display() -> bool | None:
    """True inside a Jupyter (ipykernel) session, whose outputs can update in place."""
    if "ipykernel" not in sys.modules:
        return None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:  # noqa: BLE001 - no usable IPython: plain text
        return None
    return True if shell is not None and hasattr(shell, "kernel") else None
