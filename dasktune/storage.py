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

Over ~400 lines because it holds, besides the store, :class:`AppendFile` (the file the
loggers append to, about 190 lines) and the transfer helpers, which share the retry,
redaction and local-or-remote rules of this module: AppendFile can move out once those
rules have a module of their own (it needs them, and the store builds AppendFiles).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dasktune import _dask_config
from dasktune.layout import checkpoint_dir_name, checkpoint_index
from dasktune.s3_upload import is_s3, s3_put, transfer_setting

logger = logging.getLogger(__name__)

MANIFEST = ".dasktune_checkpoint.json"
TRIAL_END_FILE = ".dasktune_trial_end.json"  # the trainable returned (see write_trial_end)
STATE_FILE = "experiment_state.json"
SEARCHER_STATE_FILE = "searcher-state.pkl"
TUNER_FILE = "tuner.pkl"

T = TypeVar("T")

# Errors that say the request itself is wrong: retrying cannot help.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              FileExistsError, ValueError, TypeError)


class StorageError(OSError):
    """Storage stayed unreachable past the retry budget; the message names the URI."""


def retry(fn: Callable[[], T], what: str, retries: int | None = None,
          backoff: float | None = None) -> T:
    """Run ``fn``, retrying transient errors (5xx, throttling, resets) with backoff."""
    retries = int(_dask_config.get("storage.retries")) if retries is None else retries
    backoff = _dask_config.get_seconds("storage.retry-backoff") if backoff is None else backoff
    delay = backoff
    for attempt in range(retries + 1):
        try:
            return fn()
        except _PERMANENT:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport error is worth a retry
            if attempt == retries:
                raise StorageError(
                    f"storage unreachable for {what} after {retries + 1} tries: "
                    f"{type(exc).__name__}: {redact(str(exc))}"
                ) from None  # the raw error may carry credentials into error.txt
            logger.warning("transient storage error on %s (%s); retrying in %.1fs",
                           what, type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    raise AssertionError("unreachable")


_SECRET_RE = re.compile(r"(?i)(key|secret|token|password|credential|signature)[^=&]*=[^&\s]+")
_BEARER_RE = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def redact(text: str) -> str:
    """Strip credentials from a URI or message (``user:pass@``, ``key=...``, ``Bearer ...``)."""
    text = re.sub(r"//[^/@\s]+@", "//", text)
    text = _BEARER_RE.sub(lambda m: m.group(1) + " ***", text)
    return _SECRET_RE.sub(lambda m: m.group(0).split("=")[0] + "=***", text)


_SECRET_KEYS = re.compile(r"(?i)(secret|passw|token|credential|private_key|access_key|"
                          r"account_key|api_?key|connection_string|session|signature|"
                          r"authorization|cookie|^key$|^auth|^sas)")


def scrub_options(options: Any) -> Any:
    """A copy of ``storage_options`` without anything that looks like a credential.

    For what is persisted (``tuner.pkl``, the experiment state): endpoints, regions
    and timeouts stay; keys, secrets, tokens, passwords, sessions, connection strings
    and ``Authorization`` headers are dropped, and strings lose ``user:pass@`` and
    ``Bearer`` tokens, so a restore takes credentials from the usual places again.
    """
    if isinstance(options, dict):
        return {k: scrub_options(v) for k, v in options.items()
                if not (isinstance(k, str) and _SECRET_KEYS.search(k))}
    if isinstance(options, (list, tuple)):
        return type(options)(scrub_options(v) for v in options)
    if isinstance(options, str):
        return redact(options)
    return options


def transfer_kwargs(fs: fsspec.AbstractFileSystem, op: str) -> dict[str, Any]:
    """Keyword arguments for ``fs.put``/``fs.get`` (``op``) that keep memory bounded.

    Only what this filesystem understands is passed: ``batch_size`` to async stores,
    ``chunksize``/``max_concurrency`` where their ``_put_file``/``_get_file`` take them.
    """
    import inspect

    if op not in ("put", "get"):
        raise ValueError(f"transfer_kwargs: op must be 'put' or 'get', got {op!r}")
    if not getattr(fs, "async_impl", False):
        return {}
    conf = {k: transfer_setting(k) for k in ("files", "get-files", "parts", "part-size")}
    # Downloads stream (64 KiB reads), so more files may be in flight than for uploads,
    # which read a file (or a part) whole before sending it.
    out: dict[str, Any] = {"batch_size": int(conf["files" if op == "put" else "get-files"])}
    try:
        params = inspect.signature(getattr(fs, f"_{op}_file")).parameters
    except (AttributeError, TypeError, ValueError):
        return out
    if op == "put":
        if "chunksize" in params:
            out["chunksize"] = int(conf["part-size"])
        if "max_concurrency" in params:
            out["max_concurrency"] = int(conf["parts"])
    elif "max_concurrency" in params:
        # One streaming GET per file, written as it arrives (64 KiB reads): ranged
        # parallel downloads buffer whole parts. Files still download in parallel.
        out["max_concurrency"] = 1
    return out


def get_files(fs: fsspec.AbstractFileSystem, rpaths: list[str], lpaths: list[str]) -> None:
    """Download ``rpaths`` to ``lpaths`` (parent folders must exist) with bounded memory:
    ``fs.get`` with :func:`transfer_kwargs` (on S3, s3fs streams each file in 64 KiB
    pieces and resumes a broken stream by range). No retry here: callers wrap it in
    :func:`retry`."""
    if rpaths:
        fs.get(rpaths, lpaths, **transfer_kwargs(fs, "get"))


def download_folder(fs: fsspec.AbstractFileSystem, remote: str, local: str, uri: str,
                    skip: frozenset[str] = frozenset()) -> None:
    """Copy the folder ``remote`` of ``fs`` into ``local`` with :func:`get_files`, leaving
    out files named in ``skip``; ``uri`` names it in errors. Cached listings are dropped
    first: another process may have written there."""
    root = fs._strip_protocol(remote).rstrip("/")
    with contextlib.suppress(Exception):  # a cache that cannot be cleared has none
        fs.invalidate_cache(root)
    found = retry(lambda: fs.find(root, detail=True), uri)
    files = [f for f in found if posixpath.basename(f) not in skip]
    lpaths = [os.path.join(local, *posixpath.relpath(fs._strip_protocol(f), root).split("/"))
              for f in files]
    for lp in lpaths:
        os.makedirs(os.path.dirname(lp), exist_ok=True)
    if files:
        retry(lambda: _get_whole(fs, files, lpaths, [found[f].get("size") for f in files]),
              uri)


def _get_whole(fs: fsspec.AbstractFileSystem, rpaths: list[str], lpaths: list[str],
               sizes: list[int | None]) -> None:
    """:func:`get_files`, then proof that each file arrived whole (its listed size)."""
    get_files(fs, rpaths, lpaths)
    for rpath, lpath, size in zip(rpaths, lpaths, sizes):
        if size is not None and os.path.getsize(lpath) != size:
            raise OSError(f"short download of {rpath}: {os.path.getsize(lpath)} of "
                          f"{size} bytes")


def put_files(fs: fsspec.AbstractFileSystem, lpaths: list[str], rpaths: list[str]) -> None:
    """Upload ``lpaths`` to ``rpaths`` with bounded memory, files in parallel.

    S3 goes through :func:`dasktune.s3_upload.s3_put`; other stores through ``fs.put`` with
    :func:`transfer_kwargs`. No retry here: callers wrap it in :func:`retry`.
    """
    if not lpaths:
        return
    if is_s3(fs):
        s3_put(fs, lpaths, rpaths, [os.path.getsize(p) for p in lpaths])
    else:
        fs.put(lpaths, rpaths, **transfer_kwargs(fs, "put"))


def as_fsspec(filesystem: Any) -> fsspec.AbstractFileSystem:
    """An fsspec filesystem for a ``storage_filesystem`` argument: fsspec's as it is, a
    ``pyarrow.fs.FileSystem`` (what Ray takes) wrapped by fsspec's ``ArrowFSWrapper``
    (pyarrow's local one is the local disk: fsspec's own)."""
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return filesystem
    pa_fs = sys.modules.get("pyarrow.fs")  # a pyarrow filesystem means pyarrow is loaded
    if pa_fs is not None and isinstance(filesystem, pa_fs.LocalFileSystem):
        return LocalFileSystem()  # the same disk: keeps the local store's fast paths
    if pa_fs is not None and isinstance(filesystem, pa_fs.FileSystem):
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(filesystem)
    raise TypeError(
        "storage_filesystem must be an fsspec filesystem or a pyarrow.fs.FileSystem, got "
        f"{type(filesystem).__name__}"
    )


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local (or an NFS-mounted) disk of this host."""
    return isinstance(fs, LocalFileSystem)


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
                with _open_creating(tmp, "wb") as f:
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


def _open_for_append(path: str, header: bytes) -> tuple[io.BufferedWriter, int]:
    """Open a local result file for appending, ``header`` written if it is new; (the
    file, its size before this open)."""
    fh = _open_creating(path, "ab")
    size = fh.tell()
    if size == 0 and header:
        fh.write(header)
    return fh, size


def _open_creating(path: str, mode: str) -> Any:
    """``open`` a local file, creating its folder only when it is missing (a trial
    writes several files into one folder: no makedirs call per file)."""
    try:
        return open(path, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, mode)


class CommitFenced(Exception):
    """A checkpoint was not committed because its attempt had been fenced off."""


class AppendFile:
    """A result file the driver appends to.

    Local and NFS paths are appended in place and flushed per batch. Object stores
    cannot append: the file is spooled in a local temporary file and the whole
    object re-uploaded at most every ``dasktune.storage.sync-period`` and on close,
    so result files stay readable remotely while the run goes on. While the store is
    unreachable past the retry budget, uploads are tried again once per sync period
    (the spool keeps every line) and the next one sends everything: results are never
    dropped. A :meth:`close` that cannot upload keeps the file open for a later try.
    """

    def __init__(self, storage: ExperimentStorage, path: str, header: bytes = b""):
        self.storage = storage
        self.path = path
        self._period = _dask_config.get_seconds("storage.sync-period")
        self._last_try = float("-inf")
        self._dirty = False
        self._base_pending = False
        self._has_dir = False
        self.closed = False
        self._size0 = 0  # the file's size when it was opened
        self._pending = bytearray()  # lines written before a local open completed
        self._opening: Future[tuple[Any, int]] | None = None
        if storage.is_local:
            # Opened (and created) on the storage's io thread: the lines wait in
            # _pending meanwhile, and reach the file at the first flush after it.
            self._fh: io.BufferedWriter | Any = None
            self._spool = None
            self._opening = storage.io.submit(_open_for_append, path, header)
        else:
            self._spool = tempfile.NamedTemporaryFile(prefix="dasktune-", delete=False)
            try:  # continue an existing file (a restored experiment)
                self._spool.write(storage.read_bytes(path))
            except FileNotFoundError:
                pass
            except StorageError as exc:
                # Unknown yet whether the file exists: read it before the first upload,
                # or an upload would replace what a restored trial logged before.
                logger.warning("%s; reading it again before the first upload", exc)
                self._base_pending = True
            self._fh = self._spool
            self._size0 = self._spool.tell()
            if self._size0 == 0 and header and not self._base_pending:
                self.write(header)

    def _opened(self, wait: bool) -> bool:
        """Whether the local file is open (``wait``: until it is); its pending lines
        are then handed to it."""
        if self._fh is not None:
            return True
        assert self._opening is not None
        if not wait and not self._opening.done():
            return False
        self._fh, self._size0 = self._opening.result()
        if self._pending:
            self._fh.write(self._pending)
            self._pending = bytearray()
        return True

    @property
    def dirty(self) -> bool:
        """Whether lines were written that storage does not have yet."""
        return self._dirty

    def write(self, data: bytes) -> None:
        if self._fh is None:
            self._pending += data
        else:
            self._fh.write(data)
        self._dirty = True

    def tell(self) -> int:
        """The file's size with what was written to it (waits for a local open)."""
        self._opened(wait=True)
        return self._fh.tell()

    @property
    def was_empty(self) -> bool:
        """Whether the file was new or empty when opened (waits for a local open)."""
        self._opened(wait=True)
        return self._size0 == 0

    def _merge_base(self) -> None:
        """Put the stored file's content before the lines spooled since (see __init__)."""
        assert self._spool is not None
        try:
            base = self.storage.read_bytes(self.path)
        except FileNotFoundError:
            base = b""
        if base:
            merged = tempfile.NamedTemporaryFile(prefix="dasktune-", delete=False)
            merged.write(base)
            self._spool.flush()
            with open(self._spool.name, "rb") as f:
                shutil.copyfileobj(f, merged)
            self._spool.close()
            os.unlink(self._spool.name)
            self._spool = self._fh = merged
        self._base_pending = False

    def _upload(self, spool_name: str) -> None:
        fs = self.storage.fs
        if not self._has_dir:  # filesystems with real folders need it for put_file
            fs.makedirs(posixpath.dirname(self.path), exist_ok=True)
            self._has_dir = True
        fs.put_file(spool_name, self.path)

    def flush(self, force: bool = False) -> None:
        """Make the written lines durable; on object stores, upload the file if a sync
        period has passed since the last try (``force``: now).

        Raises :class:`StorageError` only with ``force``: otherwise an unreachable
        store is logged and the upload tried again next period.
        """
        if not self._dirty:
            return
        if not self._opened(wait=force):
            return  # still opening: the lines go at a later flush
        self._fh.flush()
        if self._spool is None:
            self._dirty = False
            return
        now = time.monotonic()
        if not force and now - self._last_try < self._period:
            return
        self._last_try = now  # also on failure: one retry budget per period, not per call
        try:
            if self._base_pending:
                self._merge_base()
            spool_name = self._spool.name
            retry(lambda: self._upload(spool_name), self.storage.uri_of(self.path))
        except StorageError as exc:
            if force:
                raise
            logger.warning("%s; the results stay spooled and are uploaded later", exc)
            return
        self._dirty = False

    def close(self, final: bool = False) -> None:
        """Upload what is left and release the file.

        If storage is unreachable, raises :class:`StorageError` and keeps the file open,
        so a later ``close`` can upload it; with ``final`` the file is released anyway
        and a spool that could not be uploaded is kept on disk (and named in the log).
        """
        if self.closed:
            return
        try:
            self.flush(force=True)
        except StorageError as exc:
            if not final:
                raise
            if self._fh is not None:
                self._fh.close()
            self.closed = True
            logger.error("%s; the results of %s are kept in %s", exc,
                         self.storage.uri_of(self.path), getattr(self._spool, "name", "?"))
            raise
        self._opened(wait=True)
        self._fh.close()
        self.closed = True
        if self._spool is not None:
            os.unlink(self._spool.name)

    def close_soon(self) -> None:
        """:meth:`close`; a local file still being opened is closed on the io thread
        instead, after its open (:meth:`ExperimentStorage.drain` waits for it), so that
        ending a trial never waits on file creation."""
        if not self.closed and self._fh is None and self._opening is not None and \
                not self._opening.done():
            self.closed = True
            self.storage.io.submit(self._close_when_open)
            return
        self.close()

    def _close_when_open(self) -> None:
        """On the io thread: write the pending lines and close (see :meth:`close`)."""
        try:
            self._opened(wait=True)
            self._fh.flush()
            self._fh.close()
        except Exception as exc:  # noqa: BLE001 - nobody waits on this thread: say it
            logger.error("could not write %s: %s", self.path, exc)


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
