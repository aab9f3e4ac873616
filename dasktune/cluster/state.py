"""Where a running cluster is remembered between commands: one JSON file per cluster.

``$XDG_CONFIG_HOME/dasktune/clusters/<name>.json`` (mode 0600) plus a private folder
``<name>/`` for logs and TLS files. It holds addresses, process ids and a cloud cluster's
id, never a cloud credential, so ``status`` or ``down`` work from any new shell.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["ClusterState", "clusters_dir"]


def clusters_dir() -> Path:
    """``$XDG_CONFIG_HOME/dasktune/clusters`` (``~/.config`` when the variable is unset)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "dasktune" / "clusters"


class ClusterState:
    """The state file of the cluster called ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = clusters_dir() / f"{name}.json"
        self.dir = clusters_dir() / name

    def exists(self) -> bool:
        """Whether the cluster's state file exists."""
        return self.path.exists()

    def ensure_dir(self) -> Path:
        """The cluster's private folder (0700), created on first use."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        return self.dir

    def read(self) -> dict[str, Any]:
        """The recorded state; ``ValueError`` if there is none."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            raise ValueError(
                f"cluster {self.name!r} is not up (no state file {self.path})"
            ) from None

    def write(self, state: dict[str, Any]) -> None:
        """Atomically replace the state file, readable only by the user."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # O_CREAT's mode does not apply to a stale temp file left with wider permissions.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)

    def update(self, **changes: Any) -> dict[str, Any]:
        """Merge ``changes`` into the state file and return the new state."""
        state = self.read() if self.exists() else {}
        state.update(changes)
        self.write(state)
        return state

    def remove(self, *, keep_logs: bool = False) -> None:
        """Forget the cluster: its state file and private folder (TLS keys, logs).

        ``keep_logs`` keeps the ``*.log`` files (a failed ``up`` points to them) and
        removes the rest, keys included.
        """
        self.path.unlink(missing_ok=True)
        if not self.dir.is_dir():
            return
        if not keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        for entry in self.dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.suffix != ".log":
                entry.unlink(missing_ok=True)

    def private_file(self, name: str) -> Path:
        """A path in the private folder; the file is created empty with mode 0600."""
        path = self.ensure_dir() / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)
        os.chmod(path, 0o600)
        return path

    def write_tls(self, ca: str, cert: str, key: str) -> dict[str, str]:
        """Keep TLS credentials (PEM text) as private files; their paths by role, as the
        state's ``tls`` entry records them."""
        files = {}
        for role, pem in (("ca", ca), ("cert", cert), ("key", key)):
            path = self.private_file(f"tls-{role}.pem")
            path.write_text(pem)
            files[role] = str(path)
        return files
