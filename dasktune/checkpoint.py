"""``tune.Checkpoint``: a directory of files, local or in any fsspec store."""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dasktune.storage import MANIFEST, redact, retry, transfer_kwargs


class Checkpoint:
    """A checkpoint directory (Ray's ``ray.tune.Checkpoint``).

    ``path`` is a path on ``filesystem``. A checkpoint made in a trial with
    :meth:`from_directory` is local until ``tune.report(..., checkpoint=ckpt)``
    commits it to the experiment's storage; the one a trial or a
    :class:`~dasktune.Result` gets back lives there.
    """

    def __init__(self, path: str, filesystem: fsspec.AbstractFileSystem | None = None):
        if filesystem is None:
            if "://" in str(path):
                filesystem, path = fsspec.core.url_to_fs(str(path))
            else:
                filesystem = LocalFileSystem()
                path = os.path.abspath(os.path.expanduser(str(path)))
        self.path: str = str(path)
        self.filesystem: fsspec.AbstractFileSystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the local directory ``path`` (or an fsspec URI)."""
        return cls(str(path))

    @property
    def _is_local(self) -> bool:
        return isinstance(self.filesystem, LocalFileSystem)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint's files into ``path`` (a new temporary folder if None)."""
        dest = str(path) if path is not None else tempfile.mkdtemp(prefix="dasktune-ckpt-")
        os.makedirs(dest, exist_ok=True)
        if self._is_local:
            shutil.copytree(self.path, dest, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(MANIFEST))
        else:
            fs = self.filesystem
            src = fs._strip_protocol(self.path).rstrip("/")
            with contextlib.suppress(Exception):  # another process wrote it: no stale listing
                fs.invalidate_cache(src)
            found = retry(lambda: fs.find(src), self.uri)
            files = [f for f in found if posixpath.basename(f) != MANIFEST]
            lpaths = [os.path.join(dest, *posixpath.relpath(fs._strip_protocol(f), src).split("/"))
                      for f in files]
            for lp in lpaths:
                os.makedirs(os.path.dirname(lp), exist_ok=True)
            if files:
                # One call for all files: fsspec streams each from the store to disk,
                # and async stores (s3, gcs) fetch them concurrently.
                kw = transfer_kwargs(fs, "get")  # bounded memory, whatever the size
                retry(lambda: fs.get(files, lpaths, **kw), self.uri)
        return dest

    @property
    def uri(self) -> str:
        """Where the checkpoint lives, as a URI without credentials."""
        if self._is_local:
            return self.path
        protocol = self.filesystem.protocol
        protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        return redact(f"{protocol}://{self.filesystem._strip_protocol(self.path).lstrip('/')}")

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local view of the checkpoint: its own folder if local, else a temporary copy
        that is deleted on exit."""
        if self._is_local:
            yield self.path
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def get_metadata(self) -> dict[str, Any]:
        """The commit manifest's metadata (iteration, metrics) if committed."""
        path = posixpath.join(self.path.rstrip("/"), MANIFEST)
        try:
            return json.loads(retry(lambda: self.filesystem.cat_file(path), self.uri))
        except FileNotFoundError:
            return {}

    def __fspath__(self) -> str:  # lets users pass it where a path is expected, when local
        return self.path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem={self.filesystem.protocol!r}, path={self.path!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Checkpoint, (self.path, self.filesystem))
