"""Which workers can see a local ``storage_path``: a marker file the driver wrote.

A local (or NFS) path is only usable if every worker that runs trials reads and writes
the same folder. Addresses cannot tell: two workers on one host may sit in different
mount namespaces, and NFS makes another host's folder the same. So the driver writes a
random token into the experiment folder and asks each worker to read it back.

``fit()`` refuses to start when a worker present at the start is blind; a worker that
joins later is checked before its first trial, and a blind one is left out (with a
warning) rather than failing an experiment that is already running.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dasktune.storage import ExperimentStorage

logger = logging.getLogger(__name__)


def _reads_token(path: str, expected: str) -> bool:
    """On a worker: whether ``path`` holds ``expected``."""
    try:
        with open(path) as fh:
            return fh.read() == expected
    except OSError:
        return False


class SharedPathCheck:
    """The marker for one experiment's local storage folder, and what each worker saw.

    Use as a context manager (the marker is removed on exit).
    """

    def __init__(self, client: Any, storage: ExperimentStorage) -> None:
        self.client = client
        self.storage = storage
        self._token = uuid.uuid4().hex
        self.marker = storage.path(f".dasktune-marker-{self._token[:8]}")
        self._seen: dict[str, bool] = {}
        storage.makedirs(storage.experiment_path)
        with open(self.marker, "w") as fh:
            fh.write(self._token)

    def __enter__(self) -> SharedPathCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            os.unlink(self.marker)
        except OSError:
            pass

    def blind(self, workers: list[str] | None = None) -> list[str]:
        """Of ``workers`` (default: all now), those that cannot read the marker; each
        worker is asked once. A worker that cannot be asked (it just left) is not
        counted blind: the executor deals with lost workers."""
        todo = [w for w in workers if w not in self._seen] if workers is not None else None
        if todo is None or todo:
            try:
                seen = self.client.run(_reads_token, self.marker, self._token,
                                       **({"workers": todo} if todo else {}))
            except Exception as exc:  # noqa: BLE001 - a worker gone meanwhile
                logger.debug("marker check on %s failed: %r", todo or "all workers", exc)
                seen = {}
            self._seen.update(seen)
        names = workers if workers is not None else list(self._seen)
        return sorted(w for w in names if self._seen.get(w) is False)

    def refusal(self, blind: list[str]) -> str:
        return (
            f"storage_path {self.storage.storage_root!r} is a local folder that the workers "
            f"{', '.join(blind)} cannot see (they run on another host or mount). Use cloud "
            "storage (RunConfig(storage_path='s3://bucket/path')) or a filesystem shared by "
            "every node (NFS, EFS)."
        )
