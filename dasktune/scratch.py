"""Scratch folders of trials, inside the Dask worker's local directory when on a worker.

A worker that is killed (SIGKILL, a reclaimed spot machine) cannot clean up after its
trials. Its local directory can be: Dask removes the directories of dead workers when the
next worker starts on that disk. Elsewhere (the driver, a user's script) the system's
temporary folder is used. Only for folders dasktune removes itself: with workers that are
threads of the driver, the root is set in the driver, and a worker's directory goes when
its cluster closes.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["mkdtemp", "root", "set_root"]

_root: str | None = None


def set_root(path: str | None) -> None:
    """Make ``path`` (a worker's ``local_directory``) the parent of new scratch folders."""
    global _root
    _root = path


def root() -> str | None:
    """The parent of new scratch folders; None for the system's temporary folder."""
    return _root if _root and os.path.isdir(_root) else None


def mkdtemp(prefix: str) -> str:
    """A new, empty scratch folder (the caller removes it)."""
    return tempfile.mkdtemp(prefix=prefix, dir=root())
