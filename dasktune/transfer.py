"""Moving bytes between this host and an fsspec filesystem: the rules every writer of
the experiment's files follows.

- :func:`retry`: transient errors (5xx, throttling, resets) are retried with backoff up to
  ``dasktune.storage.retries``; then :class:`StorageError` names the URI. A request that
  is wrong itself (not found, permission, bad argument) is not retried.
- :func:`redact` / :func:`scrub_options`: no credential reaches a message, a log or a
  persisted file.
- :func:`put_files` / :func:`get_files` / :func:`download_folder`: transfers with bounded
  memory (files in parallel, large ones in parts or streamed), per
  ``dasktune.storage.transfer``.
- :func:`as_fsspec` / :func:`is_local`: which filesystem, and whether it is this host's disk.
- :func:`open_creating`: a local file, its folder created only when missing.

:mod:`dasktune.storage` (the experiment's layout and commits) and
:mod:`dasktune.append_file` (the result files) build on these.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import posixpath
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dasktune import _dask_config
from dasktune.s3_upload import is_s3, s3_put, transfer_setting

__all__ = ["StorageError", "as_fsspec", "download_folder", "get_files", "is_local",
           "open_creating", "put_files", "redact", "retry", "scrub_options",
           "transfer_kwargs"]

logger = logging.getLogger(__name__)

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


def open_creating(path: str, mode: str) -> Any:
    """``open`` a local file, creating its folder only when it is missing (a trial
    writes several files into one folder: no makedirs call per file)."""
    try:
        return open(path, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, mode)
