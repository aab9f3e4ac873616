"""Names of the folders in a trial's directory that several modules write or read.

A checkpoint folder is ``checkpoint_<index>``, the index zero-padded to six digits
(Ray's name, so a Ray user's scripts find it): storage writes it, the session and
the driver read the index back to number the next one, the simulator makes them up.
Pure functions, no I/O.
"""

from __future__ import annotations

import posixpath
import re

__all__ = ["CHECKPOINT_PREFIX", "STAGED_PREFIX", "checkpoint_dir_name", "checkpoint_index",
           "staged_dir_name"]

CHECKPOINT_PREFIX = "checkpoint_"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d{{6,}})$")


def checkpoint_dir_name(index: int) -> str:
    """The folder name of checkpoint ``index``: ``checkpoint_000003``."""
    if index < 0:
        raise ValueError(f"a checkpoint index is >= 0, got {index}")
    return f"{CHECKPOINT_PREFIX}{index:06d}"


def checkpoint_index(path: str) -> int | None:
    """The index in a checkpoint folder's name (the last part of ``path``), or None
    when that name is not a checkpoint folder's (``.tmp_checkpoint_...``, ``params.json``)."""
    m = _CHECKPOINT_RE.match(posixpath.basename(str(path).rstrip("/")))
    return int(m.group(1)) if m else None


#: Prefix of a staged checkpoint: the ranks of a multi-worker trial upload their files
#: there; the trial commits it under its ``checkpoint_<index>`` name (hidden: restore
#: and listings never take it for a checkpoint).
STAGED_PREFIX = ".staged_"


def staged_dir_name(group: str, report: int) -> str:
    """The staged folder of report number ``report`` of the worker group ``group``."""
    return f"{STAGED_PREFIX}{group}_{report:06d}"
