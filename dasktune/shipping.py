"""The trainable's journey to the workers, with its tracebacks intact.

cloudpickle sends code defined in the user's script (``__main__``, a notebook cell, a
module registered by value) with its file name blanked to ``<dynamic-code>`` and without
its source, so a trial's traceback says ``File "<dynamic-code>", line 14`` and shows no
line. :func:`dumps_trainable` pickles such code with its file name kept (as ``marshal``
writes a code object) and packs the source of those files along; loading the blob with
plain ``cloudpickle.loads`` on a worker puts that source in :mod:`linecache` first, so
``error.txt`` and ``Result.error`` name the user's file, line and source line, as Ray's do.
"""

from __future__ import annotations

import io
import linecache
import marshal
import pickle
import types
from typing import Any

import cloudpickle

__all__ = ["dumps_trainable"]

# A file bigger than this is not a training script: its lines are not sent along.
_MAX_SOURCE = 2 * 1024 * 1024


def _load_code(data: bytes) -> types.CodeType:
    return marshal.loads(data)


def _load(sources: dict[str, str], payload: bytes) -> Any:
    """On the worker: the user's source into linecache, then the trainable itself."""
    for filename, text in sources.items():
        lines = text.splitlines(keepends=True)
        # mtime None: linecache.checkcache keeps the entry (the file may not exist here).
        linecache.cache[filename] = (len(text), None, lines, filename)
    return cloudpickle.loads(payload)


class _Shipment:
    def __init__(self, sources: dict[str, str], payload: bytes) -> None:
        self.sources, self.payload = sources, payload

    def __reduce__(self) -> tuple[Any, ...]:
        return _load, (self.sources, self.payload)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, but a code object keeps its file name; records the files it saw."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.filenames: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            self.filenames.add(obj.co_filename)
            return _load_code, (marshal.dumps(obj),)
        return super().reducer_override(obj)


def _source(filename: str) -> str | None:
    lines = linecache.getlines(filename)  # a script's file, or a notebook cell's entry
    text = "".join(lines)
    return text if lines and len(text) <= _MAX_SOURCE else None


def dumps_trainable(trainable: Any) -> bytes:
    """The trainable as bytes for ``cloudpickle.loads`` on a worker (see the module docs)."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(trainable)
    sources = {name: text for name in sorted(pickler.filenames)
               if (text := _source(name)) is not None}
    return pickle.dumps(_Shipment(sources, buf.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
