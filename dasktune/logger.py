"""Per-trial result files as Ray Tune writes them: ``result.json``, ``progress.csv``,
``params.json``/``params.pkl`` and TensorBoard ``events.out.tfevents.*``.

Loggers are callbacks in the driver: every result passes through them in report
order, and they write through the experiment's fsspec storage (appending in place
on local and shared filesystems, re-uploading whole objects on object stores).
Writes are flushed once per batch of results, not per result. On restore each logger
rewrites a trial's file to the trial's record (``log_trial_restore_results``); the
three formats and their shared per-trial file handling stay together (~500 lines).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import numbers
import socket
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import cloudpickle

from dasktune import _dask_config, _tfevents
from dasktune.append_file import AppendFile
from dasktune.callback import Callback
from dasktune.storage import json_default
from dasktune.transfer import StorageError

if TYPE_CHECKING:
    from dasktune.storage import ExperimentStorage
    from dasktune.trial import Trial

EXPR_PARAM_FILE = "params.json"
EXPR_PARAM_PICKLE_FILE = "params.pkl"
EXPR_RESULT_FILE = "result.json"
EXPR_PROGRESS_FILE = "progress.csv"
EXPR_ERROR_FILE = "error.txt"

logger = logging.getLogger(__name__)


class LoggerCallback(Callback):
    """Base for loggers: override ``log_trial_start``, ``log_trial_result``, ``log_trial_end``.

    ``self.storage`` (the experiment's :class:`~dasktune.storage.ExperimentStorage`) is set
    before the first trial starts; ``trial.path`` is each trial's folder in it.
    """

    storage: ExperimentStorage | None = None

    def setup(self, *args: Any, storage: ExperimentStorage | None = None, **info: Any) -> None:
        self.storage = storage

    def log_trial_start(self, trial: Trial) -> None:
        """A trial started (or restarted)."""

    def log_trial_restore(self, trial: Trial) -> None:
        """A trial restarted from a checkpoint."""

    def log_trial_save(self, trial: Trial) -> None:
        """A trial committed a checkpoint."""

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """One result of a trial."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """A trial ended."""

    def log_trial_restore_results(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        """A restored trial's logged results are exactly ``results`` (see
        :meth:`~dasktune.Callback.on_trial_restore_results`): rewrite what this logger
        holds of it to them. A logger that cannot rewrite leaves it (the default)."""

    def flush(self) -> None:
        """Make what was logged so far durable (called once per batch of results)."""

    # Callback hooks -> logger hooks
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_start(trial)

    def on_trial_restore(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        self.log_trial_restore(trial)

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_save(trial)

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict[str, Any], **info: Any) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_trial_restore_results(self, iteration: int, trials: list[Trial], trial: Trial,
                                 results: list[dict[str, Any]], **info: Any) -> None:
        self.log_trial_restore_results(trial, results)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_end(trial, failed=True)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self.flush()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.flush()


class _PerTrialFiles(LoggerCallback):
    """Keeps one open :class:`AppendFile` per live trial.

    Storage outages longer than the retry budget never fail the experiment and lose no
    line: a file whose upload fails keeps its lines (the open file or its spool) and is
    uploaded at a later flush; a trial's file that cannot be closed stays open in
    ``_closing`` and is closed at a later flush, or at the experiment's end, when a
    spool that still cannot be uploaded is kept on disk and named in the log.
    """

    filename = ""

    def __init__(self) -> None:
        self._files: dict[str, AppendFile] = {}
        self._closing: dict[str, AppendFile] = {}

    def _file(self, trial: Trial) -> AppendFile:
        fh = self._files.get(trial.trial_id)
        if fh is None:
            # A restarted trial takes back its unclosed file: a second one on the same
            # object would upload without the lines the first still holds.
            fh = self._closing.pop(trial.trial_id, None)
            if fh is None:
                fh = self._open(trial)
            self._files[trial.trial_id] = fh
        return fh

    def _open(self, trial: Trial) -> AppendFile:
        """A new file for ``trial`` (subclasses choose its name and its header)."""
        assert self.storage is not None and trial.path
        return self.storage.open_append(f"{trial.path}/{self.filename}")

    def _close_file(self, trial_id: str, fh: AppendFile) -> None:
        """Close ``fh``; if storage is unreachable, keep it for a later flush to close."""
        try:
            fh.close_soon()
        except StorageError as exc:
            logger.warning("%s; the file stays open and is uploaded later", exc)
            self._closing[trial_id] = fh

    def _close_pending(self, final: bool = False) -> None:
        """Retry the closes that failed (at most once per sync period unless ``final``)."""
        for trial_id, fh in list(self._closing.items()):
            if not final:
                fh.flush()  # uploads when a period has passed; logs a failure
                if fh.dirty:
                    continue
            try:
                fh.close(final=final)
            except StorageError:  # logged by close(final=True); kept for the next try
                if not final:
                    continue
            self._closing.pop(trial_id, None)

    def flush(self) -> None:
        for fh in self._files.values():
            fh.flush()
        self._close_pending()

    def log_trial_start(self, trial: Trial) -> None:
        # Opened now, on the storage's io thread: open by the trial's first result.
        self._file(trial)

    def log_trial_restore_results(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        """Replace the trial's file by one holding ``results`` (atomically: a driver
        killed meanwhile leaves the old file or the new one); later results append."""
        assert self.storage is not None and trial.path
        for files in (self._files, self._closing):
            fh = files.pop(trial.trial_id, None)
            if fh is not None:
                fh.close(final=True)
        self._rewrite(trial, results)

    def _rewrite(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        """Write the trial's file anew, holding ``results`` (the format's own)."""
        raise NotImplementedError

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._end_file(trial.trial_id)

    def _end_file(self, trial_id: str) -> None:
        fh = self._files.pop(trial_id, None)
        if fh is not None:
            self._close_file(trial_id, fh)

    def _close_everything(self) -> None:
        """At the experiment's end: close every file, keeping what cannot be uploaded."""
        self._closing.update(self._files)
        self._files.clear()
        self._close_pending(final=True)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._close_everything()


class JsonLoggerCallback(_PerTrialFiles):
    """``result.json`` (one JSON object per line) plus ``params.json`` / ``params.pkl``."""

    filename = EXPR_RESULT_FILE

    def __init__(self) -> None:
        super().__init__()
        # params files storage has not taken yet: path -> content, written at a flush
        self._unwritten: dict[str, bytes] = {}
        # ... and those being written on the storage's io thread
        self._writing: dict[str, tuple[bytes, Future[None]]] = {}
        self._last_try = float("-inf")

    def log_trial_start(self, trial: Trial) -> None:
        assert self.storage is not None and trial.path
        self._unwritten[f"{trial.path}/{EXPR_PARAM_FILE}"] = json.dumps(
            trial.config, indent=2, sort_keys=True, default=json_default).encode()
        try:
            data = cloudpickle.dumps(trial.config)  # as Ray: lambdas and classes too
        except Exception:  # noqa: BLE001 - a config with unpicklable values keeps params.json
            data = None
        if data is not None:
            self._unwritten[f"{trial.path}/{EXPR_PARAM_PICKLE_FILE}"] = data
        self._write_params(now=True)  # first: it creates the trial's folder
        super().log_trial_start(trial)

    def _harvest(self, wait: bool = False) -> None:
        """Take back the params files whose write failed (to try again later)."""
        for path, (data, fut) in list(self._writing.items()):
            if not wait and not fut.done():
                continue
            del self._writing[path]
            exc = fut.exception()
            if exc is not None:
                logger.warning("%s; written again later", exc)
                self._unwritten.setdefault(path, data)

    def _write_params(self, now: bool = False) -> None:
        """Write the params files storage has not taken yet (failed ones: once a period)."""
        self._harvest()
        if not self._unwritten or self.storage is None:
            return
        period = _dask_config.get_seconds("storage.sync-period")
        if not now and time.monotonic() - self._last_try < period:
            return
        self._last_try = time.monotonic()
        for path, data in list(self._unwritten.items()):
            del self._unwritten[path]
            fut = self.storage.write_bytes_soon(path, data)
            self._writing[path] = (data, fut)
            if fut.done() and fut.exception() is not None:
                break  # unreachable: the rest waits a period, not one retry budget each
        self._harvest()

    def flush(self) -> None:
        super().flush()
        self._write_params()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._harvest(wait=True)
        self._write_params(now=True)
        self._harvest(wait=True)
        for path in self._unwritten:
            logger.error("could not write %s: storage unreachable",
                         self.storage.uri_of(path) if self.storage else path)
        super().on_experiment_end(trials, **info)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        self._file(trial).write(_json_line(result))

    def _rewrite(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        assert self.storage is not None
        self.storage.write_bytes(f"{trial.path}/{self.filename}",
                                 b"".join(_json_line(r) for r in results))


def _json_line(result: dict[str, Any]) -> bytes:
    return _ENCODER.encode(result).encode() + b"\n"


# One encoder for every line: json.dumps(default=...) builds a new one per call.
_ENCODER = json.JSONEncoder(default=json_default, allow_nan=True)


def flatten_dict(d: dict[str, Any], prefix: str = "", delimiter: str = "/") -> dict[str, Any]:
    """Nested dicts as one level, keys joined with ``delimiter`` (Ray's ``a/b``)."""
    if not prefix:
        for value in d.values():
            if isinstance(value, dict):
                break
        else:  # already flat (the usual result): no per-key rebuilding
            return {k if k.__class__ is str else str(k): v for k, v in d.items()}
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{delimiter}{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten_dict(value, name, delimiter))
        else:
            out[name] = value
    return out


class CSVLoggerCallback(_PerTrialFiles):
    """``progress.csv``: flattened results, columns fixed by the first result (as Ray)."""

    filename = EXPR_PROGRESS_FILE

    def __init__(self) -> None:
        super().__init__()
        self._fields: dict[str, list[str]] = {}
        # One reused row buffer and writer (csv quoting rules, without a DictWriter
        # and a StringIO per row).
        self._buf = io.StringIO()
        self._writer = csv.writer(self._buf)

    def _fields_for(self, trial: Trial, flat: dict[str, Any]) -> tuple[list[str], bool]:
        fields = self._fields.get(trial.trial_id)
        if fields is not None:
            return fields, False
        fh = self._file(trial)
        if not fh.was_empty:  # continuing a restored trial's file: keep its header
            assert self.storage is not None
            try:
                head = self.storage.fs.cat_file(f"{trial.path}/{self.filename}", start=0,
                                                end=65536)
                fields = next(csv.reader(io.StringIO(head.decode()))) or list(flat)
                self._fields[trial.trial_id] = fields
                return fields, False
            except Exception:  # noqa: BLE001 - unreadable: start a fresh header
                pass
        fields = list(flat)
        self._fields[trial.trial_id] = fields
        return fields, True

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        flat = flatten_dict({k: v for k, v in result.items() if k != "config"})
        fields, header = self._fields_for(trial, flat)
        self._file(trial).write(self._text([flat], fields, header))

    def _text(self, flats: list[dict[str, Any]], fields: list[str], header: bool) -> bytes:
        """CSV rows of the flattened results ``flats`` in ``fields``' columns."""
        buf = self._buf
        buf.seek(0)
        buf.truncate()
        if header:
            self._writer.writerow(fields)
        for flat in flats:
            self._writer.writerow([flat.get(k, "") for k in fields])
        return buf.getvalue().encode()

    def _rewrite(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        assert self.storage is not None
        flats = [flatten_dict({k: v for k, v in r.items() if k != "config"}) for r in results]
        self._fields.pop(trial.trial_id, None)
        data = b""
        if flats:  # columns fixed by the first result, as when it was first logged
            fields = self._fields[trial.trial_id] = list(flats[0])
            data = self._text(flats, fields, header=True)
        self.storage.write_bytes(f"{trial.path}/{self.filename}", data)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        super().log_trial_end(trial, failed)
        self._fields.pop(trial.trial_id, None)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EVENTS_PREFIX = "events.out.tfevents."


def _tb_step(result: dict[str, Any], iteration: int) -> int:
    """The TensorBoard step of a result, as Ray picks it: ``timesteps_total`` when set,
    else ``training_iteration``; truncated to an integer (as tensorboardX does) and
    clamped to int64, the type of ``Event.step``."""
    for key in ("timesteps_total", "training_iteration"):
        value = result.get(key)
        if value and isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                return max(_INT64_MIN, min(_INT64_MAX, int(value)))
            except (OverflowError, ValueError):  # inf / nan: not a step
                continue
    return int(iteration)


class TBXLoggerCallback(_PerTrialFiles):
    """TensorBoard event files: a scalar for every numeric metric at the result's step
    (``timesteps_total`` if reported, else ``training_iteration``; under ``ray/tune/``
    as Ray names them), and the trial's hyperparameters for the HParams tab when the
    trial ends.

    Events are encoded by :mod:`dasktune._tfevents`, not tensorboardX (whose import
    pulls in torch, seconds of CPU per driver), in the driver's loop: a result costs
    tens of microseconds, cheaper than handing it to a writer thread. Everything is
    written by the time :meth:`on_experiment_end` returns.
    """

    filename = ""
    _SKIP = frozenset({"training_iteration", "timestamp", "pid", "done", "node_ip", "trial_id",
                       "experiment_tag", "date", "hostname", "worker", "config"})

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[str, str] = {}
        self._last: dict[str, dict[str, float]] = {}

    def _name(self, trial: Trial) -> str:
        """The name of the trial's event file in this driver."""
        return self._names.setdefault(
            trial.trial_id,
            f"{_EVENTS_PREFIX}{int(time.time())}.{socket.gethostname()}.{trial.attempt}",
        )

    def _open(self, trial: Trial) -> AppendFile:
        assert self.storage is not None and trial.path
        return self.storage.open_append(
            f"{trial.path}/{self._name(trial)}",
            header=_tfevents.tf_record(_tfevents.file_version_event(time.time())))

    def _scalars(self, result: dict[str, Any]) -> list[tuple[str, float]]:
        """The scalars of a result, under their TensorBoard tags."""
        flat = flatten_dict({k: v for k, v in result.items() if k not in self._SKIP})
        scalars = []
        for key, value in flat.items():
            if type(value) is not float:  # the common case skips the ABC check
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    continue
                value = float(value)
            if math.isfinite(value):
                scalars.append((f"ray/tune/{key}", value))
        return scalars

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        scalars = self._scalars(result)
        if not scalars:
            return
        self._last[trial.trial_id] = dict(scalars)
        step = _tb_step(result, iteration)
        try:
            self._file(trial).write(
                _tfevents.tf_record(_tfevents.scalars_event(time.time(), step, scalars)))
        except Exception as exc:  # noqa: BLE001 - a logger never fails the experiment
            logger.warning("TensorBoard logging failed: %s", exc)

    def _rewrite(self, trial: Trial, results: list[dict[str, Any]]) -> None:
        """One event file holding ``results`` (at each one's own time) replaces the
        trial's event files: TensorBoard reads them all, so none may be left over."""
        assert self.storage is not None and trial.path
        self._names.pop(trial.trial_id, None)
        self._last.pop(trial.trial_id, None)
        for name in self.storage.list_names(trial.path):
            if name.startswith(_EVENTS_PREFIX):
                self.storage.delete(f"{trial.path}/{name}")
        records = []
        for result in results:
            scalars = self._scalars(result)
            if scalars:
                self._last[trial.trial_id] = dict(scalars)
                wall = result.get("timestamp")
                wall = float(wall) if isinstance(wall, (int, float)) else time.time()
                step = _tb_step(result, int(result.get("training_iteration", 0) or 0))
                records.append(_tfevents.tf_record(_tfevents.scalars_event(wall, step,
                                                                            scalars)))
        if records:
            self.storage.write_bytes(f"{trial.path}/{self._name(trial)}", b"".join(
                [_tfevents.tf_record(_tfevents.file_version_event(time.time())), *records]))

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        metrics = self._last.pop(trial.trial_id, None)
        if metrics:
            hp: dict[str, Any] = {}
            for key, value in flatten_dict(trial.evaluated_params or trial.config).items():
                if isinstance(value, (bool, str)):
                    hp[key] = value
                elif isinstance(value, numbers.Real):
                    hp[key] = float(value)  # numpy scalars too, which tensorboardX drops
                else:
                    hp[key] = str(value)
            try:
                fh = self._file(trial)
                wall = time.time()
                for summary in _tfevents.hparams_summaries(hp, metrics):
                    fh.write(_tfevents.tf_record(_tfevents.event(wall, 0, summary=summary)))
            except Exception as exc:  # noqa: BLE001 - a logger never fails the experiment
                logger.warning("TensorBoard logging failed: %s", exc)
        super().log_trial_end(trial, failed)


DEFAULT_LOGGERS = (JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback)

__all__ = [
    "LoggerCallback", "JsonLoggerCallback", "CSVLoggerCallback", "TBXLoggerCallback",
    "DEFAULT_LOGGERS", "flatten_dict",
]
