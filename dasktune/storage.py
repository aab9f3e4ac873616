"""The experiment store: one fsspec filesystem, Ray's layout, atomic commits.

Layout under ``<storage_path>/<name>/``::

    experiment_state.json        driver state, replaced atomically
    searcher-state.pkl           searcher/scheduler state, replaced atomically
    tuner.pkl                    param space and configs (no trainable)
    <trial dir>/params.json, params.pkl, result.json, progress.csv, events.out.tfevents.*
    <trial dir>/checkpoint_000003/...   + .dasktune_checkpoint.json (written last)
    <trial dir>/error.txt
    <trial dir>/.dasktune_trial_end.json   the trial ended: who ended it, its final result

The trial-end marker is written atomically by whoever ended the trial: the worker when
the trainable returned (before the attempt reports its end), the driver when it ended
the trial (a scheduler's stop, a stopper, the time budget) before it records the end
anywhere else. So a driver killed before it saved the trial's end does not run the
trial again on restore.

Commit protocol for checkpoints (holds on object stores, which cannot rename):
files are uploaded into a directory that never existed before; a manifest listing
every file and its size is written last; a checkpoint counts only when its
manifest is present, parses and matches the files. A writer killed midway leaves
a directory without a manifest, which restore skips.

An :class:`ExperimentStorage` pickles (fsspec filesystems do), so it travels to the
workers with each trial: workers write checkpoints straight to storage.

Every read and write goes through the rules of :mod:`dasktune.transfer` (retries,
redaction, bounded-memory transfers); the result files are
:class:`~dasktune.append_file.AppendFile`.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import fsspec

from dasktune.append_file import AppendFile
from dasktune.layout import checkpoint_dir_name, checkpoint_index
from dasktune.transfer import (
    StorageError,
    as_fsspec,
    download_folder,
    is_local,
    open_creating,
    put_files,
    redact,
    retry,
)

logger = logging.getLogger(__name__)

MANIFEST = ".dasktune_checkpoint.json"
TRIAL_END_FILE = ".dasktune_trial_end.json"  # the trainable returned (see write_trial_end)
STATE_FILE = "experiment_state.json"
SEARCHER_STATE_FILE = "searcher-state.pkl"
TUNER_FILE = "tuner.pkl"


class ExperimentStorage:
    """Where one experiment's files live, and the only code that writes them."""

    def __init__(self, storage_path: str, name: str,
                 filesystem: fsspec.AbstractFileSystem | None = None,
                 storage_options: dict[str, Any] | None = None):
        if filesystem is not None:
            fs = as_fsspec(filesystem)
            root = fs._strip_protocol(storage_path)
        else:
            if "://" not in storage_path:
                storage_path = os.path.abspath(os.path.expanduser(storage_path))
            fs, root = fsspec.core.url_to_fs(storage_path, **(storage_options or {}))
        self.fs: fsspec.AbstractFileSystem = fs
        self.storage_root = root.rstrip("/") or "/"
        self.name = name
        self.experiment_path = posixpath.join(self.storage_root, name)
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        self.protocol = protocol
        self._io: ThreadPoolExecutor | None = None

    @classmethod
    def from_experiment_path(cls, path: str, filesystem: Any = None,
                             storage_options: dict[str, Any] | None = None) -> ExperimentStorage:
        """The store of an existing experiment at ``path`` (a folder or URI)."""
        path = path.rstrip("/")
        parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
        if "://" in path and parent.endswith(":/"):
            parent += "/"
        return cls(parent or ".", name, filesystem=filesystem, storage_options=storage_options)

    # ---------------------------------------------------------------- naming
    @property
    def uri(self) -> str:
        """The experiment's location as a user would write it (no credentials)."""
        if self.is_local:
            return self.experiment_path
        return redact(f"{self.protocol}://{self.experiment_path}")

    def uri_of(self, path: str) -> str:
        """``path`` on this store as a URI for messages (no credentials)."""
        if self.is_local:
            return path
        return redact(f"{self.protocol}://{path.lstrip('/')}")

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    @property
    def io(self) -> ThreadPoolExecutor:
        """One thread, in submission order, for the driver's local file creations.

        Creating a file is a metadata operation that costs about a millisecond on a VM
        disk and more on NFS; a trial creates five (params, results, progress, events),
        so the driver loop hands them here and goes on taking results.
        """
        if self._io is None:
            self._io = ThreadPoolExecutor(1, thread_name_prefix="dasktune-io")
        return self._io

    def drain(self) -> None:
        """Wait until the :attr:`io` thread did everything handed to it so far."""
        if self._io is not None:
            self._io.submit(lambda: None).result()

    def write_bytes_soon(self, path: str, data: bytes) -> Future[None]:
        """:meth:`write_bytes` on the :attr:`io` thread (local stores; elsewhere now)."""
        if not self.is_local:
            fut: Future[None] = Future()
            try:
                self.write_bytes(path, data)
                fut.set_result(None)
            except StorageError as exc:
                fut.set_exception(exc)
            return fut
        return self.io.submit(self.write_bytes, path, data)

    def _fresh(self, path: str) -> None:
        """Forget cached listings under ``path``: other processes write there too, and a
        stale listing would hide a new checkpoint or reuse a directory."""
        if not self.is_local:
            try:
                self.fs.invalidate_cache(path)
            except Exception:  # noqa: BLE001 - a cache that cannot be cleared has none
                pass

    def path(self, *parts: str) -> str:
        return posixpath.join(self.experiment_path, *parts)

    def trial_path(self, dirname: str) -> str:
        return self.path(dirname)

    # ---------------------------------------------------------------- basics
    def makedirs(self, path: str) -> None:
        retry(lambda: self.fs.makedirs(path, exist_ok=True), self.uri_of(path))

    def exists(self, path: str) -> bool:
        self._fresh(path)
        return retry(lambda: self.fs.exists(path), self.uri_of(path))

    def write_bytes(self, path: str, data: bytes, durable: bool = False) -> None:
        """Write a whole file atomically: readers see the old or the new content.

        ``durable`` also fsyncs (survives a power loss, not just a killed process).
        """

        def _write() -> None:
            if self.is_local:
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
                with open_creating(tmp, "wb") as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, path)
            else:
                # One PUT: object stores publish an object whole or not at all.
                if not self.fs.exists(posixpath.dirname(path)):
                    self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                self.fs.pipe_file(path, data)

        retry(_write, self.uri_of(path))

    def write_json(self, path: str, obj: Any, durable: bool = False) -> None:
        self.write_bytes(path, json.dumps(obj, default=json_default, separators=(",", ":"))
                         .encode(), durable=durable)

    def read_bytes(self, path: str) -> bytes:
        return retry(lambda: self.fs.cat_file(path), self.uri_of(path))

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_bytes(path))

    def check_writable(self) -> None:
        """Create the experiment folder and prove it can be written (before any trial)."""
        probe = self.path(f".write-test-{uuid.uuid4().hex[:8]}")
        try:
            self.makedirs(self.experiment_path)
            self.write_bytes(probe, b"ok")
            self.fs.rm(probe)
        except Exception as exc:
            raise ValueError(
                f"storage path {self.uri!r} cannot be written: {type(exc).__name__}: "
                f"{redact(str(exc))}"
            ) from None

    def open_append(self, path: str, header: bytes = b"") -> AppendFile:
        """A result file to append to; ``header`` starts it if it is new or empty."""
        return AppendFile(self, path, header)

    # ----------------------------------------------------------- checkpoints
    def commit_checkpoint(self, local_dir: str, trial_path: str, index: int,
                          metadata: dict[str, Any],
                          fenced: Callable[[], bool] | None = None) -> str:
        """Upload ``local_dir`` as a new checkpoint of the trial and commit it.

        Returns the checkpoint's path. The name is :func:`~dasktune.layout.checkpoint_dir_name`
        of ``index``, or the next
        free index if a crashed writer left that directory behind (never reused).
        ``fenced`` is asked once the files are up, before the manifest: if it says the
        attempt was given up meanwhile, the files are removed and :class:`CommitFenced`
        raised, so a zombie never commits into a trial another attempt now writes.
        """
        fs = self.fs
        dest, index = self._free_checkpoint_dir(trial_path, index)
        files = _local_files(local_dir)
        if self.is_local:
            # Copy into a hidden sibling, then rename: the directory appears whole.
            tmp = posixpath.join(trial_path, f".tmp_{os.path.basename(dest)}_{uuid.uuid4().hex[:6]}")
            shutil.copytree(local_dir, tmp, ignore=shutil.ignore_patterns(MANIFEST))
            os.replace(tmp, dest)
        else:
            fs.makedirs(dest, exist_ok=True)
            lpaths = [os.path.join(local_dir, *rel.split("/")) for rel in files]
            rpaths = [posixpath.join(dest, rel) for rel in files]
            # Files stream from disk, in parallel (see put_files).
            retry(lambda: put_files(fs, lpaths, rpaths), self.uri_of(dest))
        return self._seal(dest, index, files, metadata, fenced)

    def stage_files(self, local_dir: str, staged: str) -> None:
        """Upload ``local_dir``'s files into the folder ``staged`` of this store, beside
        what others put there (several processes fill one staged checkpoint; see
        :meth:`commit_staged`)."""
        files = _local_files(local_dir)
        if self.is_local:
            shutil.copytree(local_dir, staged, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(MANIFEST))
            return
        lpaths = [os.path.join(local_dir, *rel.split("/")) for rel in files]
        rpaths = [posixpath.join(staged, rel) for rel in files]
        retry(lambda: put_files(self.fs, lpaths, rpaths), self.uri_of(staged))

    def commit_staged(self, staged: str, trial_path: str, index: int,
                      metadata: dict[str, Any],
                      fenced: Callable[[], bool] | None = None) -> str:
        """Commit the folder ``staged`` (filled by :meth:`stage_files`) as the trial's
        next checkpoint, as :meth:`commit_checkpoint` does a local folder: moved to its
        ``checkpoint_NNNNNN`` name (a rename on a local store), manifest last."""
        fs = self.fs
        dest, index = self._free_checkpoint_dir(trial_path, index)
        if self.is_local:
            os.makedirs(staged, exist_ok=True)  # every rank reported a checkpoint of nothing
            files = _local_files(staged)
            os.replace(staged, dest)
        else:
            found = fs.find(staged, detail=True) if fs.exists(staged) else {}
            root = fs._strip_protocol(staged)
            files = {posixpath.relpath(fs._strip_protocol(p), root): int(info.get("size") or 0)
                     for p, info in found.items()}
            if files:  # an object store cannot rename: copy each file, then drop the stage
                names = list(files)
                retry(lambda: fs.copy([posixpath.join(staged, n) for n in names],
                                      [posixpath.join(dest, n) for n in names]),
                      self.uri_of(dest))
                fs.rm(staged, recursive=True)
        return self._seal(dest, index, files, metadata, fenced)

    def _free_checkpoint_dir(self, trial_path: str, index: int) -> tuple[str, int]:
        """The first ``checkpoint_NNNNNN`` folder from ``index`` on that does not exist."""
        while True:
            dest = posixpath.join(trial_path, checkpoint_dir_name(index))
            if not self.exists(dest):
                return dest, index
            index += 1

    def _seal(self, dest: str, index: int, files: dict[str, int], metadata: dict[str, Any],
              fenced: Callable[[], bool] | None) -> str:
        """Commit the checkpoint whose ``files`` are in ``dest``: its manifest, written last
        (unless ``fenced`` says the attempt was given up: then the files go)."""
        if fenced is not None and fenced():
            try:
                if self.is_local:
                    shutil.rmtree(dest, ignore_errors=True)
                else:
                    self.fs.rm(dest, recursive=True)
            except Exception:  # noqa: BLE001 - uncommitted files are ignored by restore
                pass
            raise CommitFenced(f"checkpoint {self.uri_of(dest)} not committed: the attempt "
                               "was given up while it uploaded")
        manifest = {"files": files, "committed_at": time.time(), **metadata,
                    "checkpoint_index": index}
        self.write_bytes(posixpath.join(dest, MANIFEST),
                         json.dumps(manifest, default=json_default).encode())
        return dest

    def write_trial_end(self, trial_path: str, *, trial_id: str, attempt: int,
                        result: dict[str, Any], ended_by: str = "trainable", reason: str = "",
                        rung: dict[str, Any] | None = None) -> None:
        """Record that a trial ended and never runs again (replaced atomically).

        The marker holds the trial's ``attempt``, its final ``result`` (without its
        config) and ``training_iteration``, who ended it (``ended_by``: ``"trainable"``,
        written by the worker when the trainable returned or its result said done;
        ``"scheduler"``, ``"stopper"`` or ``"experiment"``, written by the driver), why
        (``reason``), and for a scheduler's early stop the ``rung``
        (``{"time_attr": ..., "value": ...}``).
        """
        final = {k: v for k, v in result.items() if k != "config"}
        end = {"trial_id": trial_id, "attempt": attempt,
               "training_iteration": final.get("training_iteration", 0), "result": final,
               "ended_by": ended_by, "reason": reason, "rung": rung}
        self.makedirs(trial_path)
        # Atomic, not fsynced: it must outlive a killed driver (the page cache does), and
        # an fsync in every trial's last step cost short trials 10-17% of their time.
        self.write_json(posixpath.join(trial_path, TRIAL_END_FILE), end)

    def read_trial_end(self, trial_path: str) -> dict[str, Any] | None:
        """The trial-end marker :meth:`write_trial_end` wrote, or None (absent or broken)."""
        path = posixpath.join(trial_path, TRIAL_END_FILE)
        try:
            end = self.read_json(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError):
            return None
        return end if isinstance(end, dict) and isinstance(end.get("result"), dict) else None

    def read_manifest(self, checkpoint_path: str) -> dict[str, Any] | None:
        """The manifest of a committed checkpoint, or None if it is absent or broken.

        An unreachable store raises :class:`StorageError` instead: "not committed"
        would make a restore skip a valid checkpoint.
        """
        path = posixpath.join(checkpoint_path, MANIFEST)
        self._fresh(checkpoint_path)
        try:
            raw = retry(lambda: self.fs.cat_file(path), self.uri_of(path))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            manifest = json.loads(raw)
        except ValueError:  # half-written by a writer that died: not committed
            return None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return None
        return manifest

    def is_committed(self, checkpoint_path: str, verify_files: bool = True) -> bool:
        """Whether the checkpoint's manifest is there and every file it lists has its size."""
        manifest = self.read_manifest(checkpoint_path)
        if manifest is None:
            return False
        if not verify_files:
            return True
        root = checkpoint_path.rstrip("/")
        try:
            listing = retry(lambda: self.fs.find(root, detail=True), self.uri_of(root))
        except FileNotFoundError:
            return False
        found = {posixpath.relpath(self.fs._strip_protocol(name), self.fs._strip_protocol(root)):
                 info.get("size") for name, info in listing.items()}
        for rel, size in manifest["files"].items():
            if rel not in found or (size is not None and found[rel] != size):
                return False
        return True

    def list_names(self, folder: str, folders_only: bool = False) -> list[str]:
        """The names in ``folder`` (not their paths; only sub-folders with ``folders_only``),
        or [] when it does not exist."""
        self._fresh(folder)
        try:
            entries = retry(lambda: self.fs.ls(folder, detail=True), self.uri_of(folder))
        except FileNotFoundError:
            return []
        return [posixpath.basename(e["name"].rstrip("/")) for e in entries
                if not folders_only or e.get("type") == "directory"]

    def list_checkpoints(self, trial_path: str) -> list[str]:
        """Checkpoint directories of a trial, oldest first (committed or not)."""
        self._fresh(trial_path)
        try:
            entries = retry(lambda: self.fs.ls(trial_path, detail=False),
                            self.uri_of(trial_path))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            index = checkpoint_index(entry)
            if index is not None:
                found.append((index, entry.rstrip("/")))
        return [p for _, p in sorted(found)]

    def latest_committed_checkpoint(self, trial_path: str) -> str | None:
        """The newest checkpoint whose commit completed (a crashed upload is skipped)."""
        for path in reversed(self.list_checkpoints(trial_path)):
            if self.is_committed(path):
                return path
        return None

    def delete(self, path: str) -> None:
        try:
            retry(lambda: self.fs.rm(path, recursive=True), self.uri_of(path))
        except FileNotFoundError:
            pass

    def download(self, remote: str, local: str) -> None:
        """Copy the folder ``remote`` into ``local``, streaming (see :func:`get_files`)."""
        download_folder(self.fs, remote, local, self.uri_of(remote))

    # ------------------------------------------------------ pickling to workers
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_io"] = None  # a thread stays with its process
        return state


def _local_files(local_dir: str) -> dict[str, int]:
    """The files under ``local_dir`` (``/``-separated relative path: size), no manifest."""
    files: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(local_dir):
        for fname in names:
            full = os.path.join(dirpath, fname)
            rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
            if rel != MANIFEST:
                files[rel] = os.path.getsize(full)
    return files


class CommitFenced(Exception):
    """A checkpoint was not committed because its attempt had been fenced off."""


def json_default(obj: Any) -> Any:
    """``json.dumps(default=...)`` for results and state: numpy scalars and arrays as
    numbers and lists, sets and tuples as lists, anything else as its repr."""
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return repr(obj)
