"""Per-trial result files as Ray Tune writes them: ``result.json``, ``progress.csv``,
``params.json``/``params.pkl`` and TensorBoard ``events.out.tfevents.*``.

Loggers are callbacks in the driver: every result passes through them in report
order, and they write through the experiment's fsspec storage (appending in place
on local and shared filesystems, re-uploading whole objects on object stores).
Writes are flushed once per batch of results, not per result.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import numbers
import pickle
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from dasktune import _dask_config
from dasktune.callback import Callback
from dasktune.storage import AppendFile, StorageError, _json_default

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
                assert self.storage is not None and trial.path
                fh = self.storage.open_append(f"{trial.path}/{self.filename}")
            self._files[trial.trial_id] = fh
        return fh

    def _close_file(self, trial_id: str, fh: AppendFile) -> None:
        """Close ``fh``; if storage is unreachable, keep it for a later flush to close."""
        try:
            fh.close()
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
        # params files storage could not take yet: path -> content, written at a flush
        self._unwritten: dict[str, bytes] = {}
        self._last_try = float("-inf")

    def log_trial_start(self, trial: Trial) -> None:
        assert self.storage is not None and trial.path
        self._unwritten[f"{trial.path}/{EXPR_PARAM_FILE}"] = json.dumps(
            trial.config, indent=2, sort_keys=True, default=_json_default).encode()
        try:
            data = pickle.dumps(trial.config)
        except Exception:  # noqa: BLE001 - a config with unpicklable values keeps params.json
            data = None
        if data is not None:
            self._unwritten[f"{trial.path}/{EXPR_PARAM_PICKLE_FILE}"] = data
        self._write_params(now=True)

    def _write_params(self, now: bool = False) -> None:
        """Write the params files storage has not taken yet (failed ones: once a period)."""
        if not self._unwritten or self.storage is None:
            return
        period = _dask_config.get_seconds("storage.sync-period")
        if not now and time.monotonic() - self._last_try < period:
            return
        self._last_try = time.monotonic()
        for path, data in list(self._unwritten.items()):
            try:
                self.storage.write_bytes(path, data)
            except StorageError as exc:
                logger.warning("%s; written again later", exc)
                return
            del self._unwritten[path]

    def flush(self) -> None:
        super().flush()
        self._write_params()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._write_params(now=True)
        for path in self._unwritten:
            logger.error("could not write %s: storage unreachable",
                         self.storage.uri_of(path) if self.storage else path)
        super().on_experiment_end(trials, **info)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        line = json.dumps(result, default=_json_default, allow_nan=True)
        self._file(trial).write(line.encode() + b"\n")


def flatten_dict(d: dict[str, Any], prefix: str = "", delimiter: str = "/") -> dict[str, Any]:
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

    def _fields_for(self, trial: Trial, flat: dict[str, Any]) -> tuple[list[str], bool]:
        fields = self._fields.get(trial.trial_id)
        if fields is not None:
            return fields, False
        fh = self._file(trial)
        if fh.tell() > 0:  # continuing a restored trial's file: keep its header
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
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
        if header:
            writer.writeheader()
        writer.writerow({k: flat.get(k, "") for k in fields})
        self._file(trial).write(buf.getvalue().encode())

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        super().log_trial_end(trial, failed)
        self._fields.pop(trial.trial_id, None)


def _tf_record(data: bytes) -> bytes:
    from tensorboardX.record_writer import masked_crc32c

    header = struct.pack("Q", len(data))
    return (header + struct.pack("I", masked_crc32c(header)) + data
            + struct.pack("I", masked_crc32c(data)))


class _TrialRef(NamedTuple):
    """What the TensorBoard writer thread needs of a trial, taken when the result came."""

    trial_id: str
    path: str | None
    attempt: int


class TBXLoggerCallback(_PerTrialFiles):
    """TensorBoard event files: a scalar for every numeric metric at its
    ``training_iteration`` (under ``ray/tune/`` as Ray names them), and the trial's
    hyperparameters for the HParams tab when the trial ends.

    Encoding and writing happen on a writer thread of the callback's own, as
    tensorboardX's ``EventFileWriter`` does: importing tensorboardX takes seconds when
    torch is installed (it imports torch), and that must not stall the driver's loop
    while trials wait for their results to be taken. Every queued event is written
    before :meth:`on_experiment_end` returns.
    """

    filename = ""
    _SKIP = frozenset({"training_iteration", "timestamp", "pid", "done", "node_ip", "trial_id",
                       "experiment_tag", "date", "hostname", "worker", "config"})
    _CLOSE_TIMEOUT = 300.0

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[str, str] = {}
        self._last: dict[str, dict[str, float]] = {}
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._unflushed = False

    def setup(self, *args: Any, storage: ExperimentStorage | None = None, **info: Any) -> None:
        super().setup(*args, storage=storage, **info)
        self._start()  # the import starts now, while the first trials are placed

    # ------------------------------------------------------------ writer thread
    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                            name="dasktune-tensorboard")
            self._thread.start()

    def _submit(self, job: Callable[[], None]) -> None:
        self._start()
        self._jobs.put(job)

    def _write_loop(self) -> None:
        try:
            import tensorboardX.proto.event_pb2  # noqa: F401 - the slow import, off the loop
        except Exception as exc:  # noqa: BLE001 - reported per job below
            logger.warning("TensorBoard logging is off: %s", exc)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - a logger never fails the experiment
                logger.warning("TensorBoard logging failed: %s", exc)

    def _file(self, trial: Trial | _TrialRef) -> AppendFile:
        fh = self._files.get(trial.trial_id)
        if fh is None:
            from tensorboardX.proto.event_pb2 import Event

            assert self.storage is not None and trial.path
            name = self._names.setdefault(
                trial.trial_id,
                f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{trial.attempt}",
            )
            fh = self.storage.open_append(f"{trial.path}/{name}")
            if fh.tell() == 0:
                fh.write(_tf_record(Event(wall_time=time.time(),
                                          file_version="brain.Event:2").SerializeToString()))
            self._files[trial.trial_id] = fh
        return fh

    def _write_scalars(self, ref: _TrialRef, wall: float, step: int,
                       scalars: list[tuple[str, float]]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalars]
        event = Event(wall_time=wall, step=step, summary=Summary(value=values))
        self._file(ref).write(_tf_record(event.SerializeToString()))

    def _write_hparams(self, ref: _TrialRef, hp: dict[str, Any],
                       metrics: dict[str, float]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import hparams

        fh = self._file(ref)
        for summary in hparams(hp, metrics):
            event = Event(wall_time=time.time(), step=0, summary=summary)
            fh.write(_tf_record(event.SerializeToString()))

    # ------------------------------------------------------------ driver side
    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        step = int(result.get("training_iteration", iteration))
        flat = flatten_dict({k: v for k, v in result.items() if k not in self._SKIP})
        scalars = []
        for key, value in flat.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Number):
                continue
            value = float(value)
            if math.isnan(value) or math.isinf(value):
                continue
            scalars.append((f"ray/tune/{key}", value))
        if not scalars:
            return
        self._last[trial.trial_id] = dict(scalars)
        ref = _TrialRef(trial.trial_id, trial.path, trial.attempt)
        wall = time.time()
        self._submit(lambda: self._write_scalars(ref, wall, step, scalars))
        self._unflushed = True

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        ref = _TrialRef(trial.trial_id, trial.path, trial.attempt)
        metrics = self._last.pop(trial.trial_id, None)
        if metrics:
            hp: dict[str, Any] = {}
            for key, value in flatten_dict(trial.evaluated_params or trial.config).items():
                if isinstance(value, (bool, str)) or isinstance(value, numbers.Number):
                    hp[key] = value
                else:
                    hp[key] = str(value)
            self._submit(lambda: self._write_hparams(ref, hp, metrics))
        self._submit(lambda: self._end_file(ref.trial_id))

    def flush(self) -> None:
        if self._unflushed:
            self._unflushed = False
            self._submit(super().flush)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._submit(self._close_everything)
        thread = self._thread
        self._jobs.put(None)
        if thread is not None:
            thread.join(self._CLOSE_TIMEOUT)
            if thread.is_alive():
                logger.warning("TensorBoard files were still being written after %.0fs",
                               self._CLOSE_TIMEOUT)
        self._thread = None


DEFAULT_LOGGERS = (JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback)

__all__ = [
    "LoggerCallback", "JsonLoggerCallback", "CSVLoggerCallback", "TBXLoggerCallback",
    "DEFAULT_LOGGERS", "flatten_dict",
]
