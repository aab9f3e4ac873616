"""The result files the driver appends to (``result.json``, ``progress.csv``, TensorBoard
events), on any store: in place on a local or NFS disk; on an object store, which cannot
append, spooled locally and uploaded whole every sync period, without ever dropping a
line while the store is unreachable.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import shutil
import tempfile
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dasktune import _dask_config
from dasktune.transfer import StorageError, open_creating, retry

if TYPE_CHECKING:
    from dasktune.storage import ExperimentStorage

__all__ = ["AppendFile"]

logger = logging.getLogger(__name__)


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


def _open_for_append(path: str, header: bytes) -> tuple[io.BufferedWriter, int]:
    """Open a local result file for appending, ``header`` written if it is new; (the
    file, its size before this open)."""
    fh = open_creating(path, "ab")
    size = fh.tell()
    if size == 0 and header:
        fh.write(header)
    return fh, size
