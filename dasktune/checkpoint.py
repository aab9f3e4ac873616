"""``tune.Checkpoint``: a directory of files, local or in any fsspec store."""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dasktune import scratch
from dasktune.storage import MANIFEST
from dasktune.transfer import download_folder, redact, retry

# Where set_metadata stores the user's metadata, as Ray 2.x names it.
METADATA_FILE = ".metadata.json"


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
            # Files (and ranges of big ones) fetched concurrently, each streamed to disk:
            # memory stays bounded whatever the checkpoint's size.
            download_folder(self.filesystem, self.path, dest, self.uri,
                            skip=frozenset({MANIFEST}))
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
        # Deleted on exit: scratch in the worker's local directory is fine (a folder from
        # to_directory() is the caller's to keep, so that one goes to the system's temp).
        tmp = self.to_directory(scratch.mkdtemp("dasktune-ckpt-"))
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def get_metadata(self) -> dict[str, Any]:
        """The metadata stored with the checkpoint, ``{}`` if there is none (Ray's API).

        That is what :meth:`set_metadata` / :meth:`update_metadata` stored (in the hidden
        ``.metadata.json`` of the folder, as Ray does), on top of what dasktune records
        when it commits a checkpoint (``training_iteration``, ``checkpoint_index``, the
        metrics...); the user's keys win where both have one.
        """
        committed = self._read_json(MANIFEST, broken_ok=True)
        committed.pop("files", None)  # the commit's file list is bookkeeping, not metadata
        return {**committed, **self._read_json(METADATA_FILE)}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Store ``metadata`` (a JSON-serializable dict) with the checkpoint, replacing
        what :meth:`set_metadata` stored before."""
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        data = json.dumps(metadata).encode()  # before writing: a bad value changes nothing
        path = self._join(METADATA_FILE)
        fs = self.filesystem
        if self._is_local:
            os.makedirs(self.path, exist_ok=True)
            # write then rename: a reader never sees half a file
            tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            retry(lambda: fs.pipe_file(path, data), self.uri)
        self._recommit(len(data))

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into what :meth:`set_metadata` stored before."""
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        self.set_metadata({**self._read_json(METADATA_FILE), **metadata})

    def _join(self, name: str) -> str:
        if self._is_local:
            return os.path.join(self.path, name)
        return posixpath.join(self.path.rstrip("/"), name)

    def _read_json(self, name: str, broken_ok: bool = False) -> dict[str, Any]:
        """The dict in the checkpoint's file ``name``; ``{}`` if there is none."""
        path = self._join(name)
        try:
            raw = retry(lambda: self.filesystem.cat_file(path), self.uri)
        except FileNotFoundError:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            if broken_ok:  # a commit manifest half-written by a writer that died
                return {}
            raise ValueError(f"{redact(self.uri)}: {name} is not valid JSON") from None
        return value if isinstance(value, dict) else {}

    def _recommit(self, size: int) -> None:
        """Record the metadata file's new size in a committed checkpoint's manifest, so
        the checkpoint still verifies as complete (its manifest lists every file's size)."""
        manifest = self._read_json(MANIFEST, broken_ok=True)
        files = manifest.get("files")
        if not isinstance(files, dict) or files.get(METADATA_FILE) == size:
            return
        files[METADATA_FILE] = size
        data = json.dumps(manifest).encode()
        retry(lambda: self.filesystem.pipe_file(self._join(MANIFEST), data), self.uri)

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
