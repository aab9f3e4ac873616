"""The provider contract, and what every provider does the same way through a Dask client."""

from __future__ import annotations

import abc
import os
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dasktune.cluster.config import ClusterConfig
from dasktune.cluster.state import ClusterState

if TYPE_CHECKING:
    from distributed import Client
    from distributed.security import Security

__all__ = ["ClusterProvider", "Progress", "WorkerInfo", "quiet"]

Progress = Callable[[str], None]


def quiet(_msg: str) -> None:
    """The :data:`Progress` callback that prints nothing (the default)."""
    return None


class WorkerInfo(dict):
    """One worker as ``status`` shows it: name, address, nthreads, resources, memory_limit."""


class ClusterProvider(abc.ABC):
    """Starts, stops and reaches one cluster described by a :class:`ClusterConfig`.

    Contract: ``up`` returns once the scheduler answers and ``min_workers`` workers joined
    (or raises after a bounded wait, leaving nothing running); everything needed by the
    other methods is then in :attr:`state`, so they work from a new process. ``down`` is
    idempotent and leaves no process or instance behind.
    """

    kind: str = ""

    def __init__(self, config: ClusterConfig, name: str | None = None) -> None:
        self.config = config
        self.name = name or config.cluster_name
        self.state = ClusterState(self.name)

    # -- lifecycle, provider-specific -------------------------------------------------
    @abc.abstractmethod
    def up(self, *, restart_only: bool = False, timeout: float = 300.0,
           progress: Progress = quiet) -> dict[str, Any]:
        """Start (or update) the cluster; return its state."""

    @abc.abstractmethod
    def down(self, *, progress: Progress = quiet) -> None:
        """Stop everything this cluster started; remove its state."""

    @abc.abstractmethod
    def kill_worker_hard(self, *, rng: random.Random | None = None) -> str:
        """Kill one worker process or instance without warning; return what was killed."""

    @abc.abstractmethod
    def exec(self, command: str) -> int:
        """Run a shell command on the head node; return its exit status."""

    @abc.abstractmethod
    def submit(self, script: str, args: Sequence[str], *, detach: bool = False,
               then_down: bool = False) -> tuple[int, str | None]:
        """Run ``script`` as the driver with ``--address``; (exit status, job id if detached)."""

    @abc.abstractmethod
    def logs(self, job: str | None = None) -> tuple[str, bool]:
        """(the output so far of a detached job, the latest by default; whether it still runs)."""

    # -- common, through a client ---------------------------------------------------------
    @property
    def address(self) -> str:
        """The running cluster's scheduler address (an error if it is not up)."""
        address = self.state.read().get("scheduler_address")
        if not address:
            raise ValueError(f"cluster {self.name!r} has no scheduler address yet (up failed?)")
        return address

    def security(self) -> Security | None:
        """The client-side TLS settings recorded by ``up`` (None for plain tcp)."""
        tls = self.state.read().get("tls")
        if not tls:
            return None
        from distributed.security import Security

        return Security(tls_ca_file=tls["ca"], tls_client_cert=tls["cert"],
                        tls_client_key=tls["key"], require_encryption=True)

    def client_env(self) -> dict[str, str]:
        """Environment for a driver: the address and, for TLS, the certificate files."""
        env = {"DASK_SCHEDULER_ADDRESS": self.address}
        tls = self.state.read().get("tls")
        if tls:
            env.update({
                "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
                "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": tls["ca"],
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": tls["cert"],
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": tls["key"],
            })
        return env

    def connect(self, timeout: float = 10.0) -> Client:
        """A ``distributed.Client`` connected to the running cluster."""
        from distributed import Client

        try:
            return Client(self.address, security=self.security(), timeout=f"{timeout}s",
                          set_as_default=False)
        except OSError as e:
            raise ValueError(f"cluster {self.name!r}: scheduler {self.address} "
                             f"does not answer ({e})") from None

    def dashboard_url(self) -> str | None:
        """The Dask dashboard's address, if the cluster published one."""
        return self.state.read().get("dashboard_url")

    def workers(self) -> list[WorkerInfo]:
        """The cluster's workers as the scheduler sees them."""
        with self.connect() as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
        return [WorkerInfo(name=str(w.get("name")), address=addr, nthreads=w.get("nthreads"),
                           resources=w.get("resources") or {},
                           memory_limit=w.get("memory_limit"))
                for addr, w in sorted(info.items())]

    def run_setup_commands(self, progress: Progress = quiet) -> None:
        """Run the cluster file's ``setup_commands`` here, on the head, in order (a
        failing one raises ``CalledProcessError``)."""
        for cmd in self.config.setup_commands:
            progress(f"setup: {cmd}")
            subprocess.run(cmd, shell=True, check=True)

    def wait_for_workers(self, n: int, timeout: float, progress: Progress = quiet) -> None:
        """Block until ``n`` workers joined, reporting each change; bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        seen = -1
        with self.connect(timeout=max(1.0, min(timeout, 30.0))) as client:
            while True:
                count = len(client.scheduler_info(n_workers=-1)["workers"])
                if count != seen:
                    progress(f"workers joined {count}/{n}")
                    seen = count
                if count >= n:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {count}/{n} workers joined within {timeout:.0f}s")
                time.sleep(0.2)

    def retire_random_worker(self, *, rng: random.Random | None = None) -> str:
        """Gracefully retire one worker through the scheduler; return its address."""
        with self.connect() as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            if not workers:
                raise ValueError(f"cluster {self.name!r} has no workers")
            victim = (rng or random).choice(workers)
            client.retire_workers(workers=[victim], close_workers=True)
        return victim

    def rsync_up(self, src: str, dst: str | None = None) -> str:
        """Send a file or folder to every worker (now and later) with Dask's upload plugins."""
        from distributed.diagnostics.plugin import UploadDirectory, UploadFile

        src = os.path.abspath(os.path.expanduser(src))
        if not os.path.exists(src):
            raise ValueError(f"rsync-up: no such file or folder: {src}")
        with self.connect() as client:
            if os.path.isdir(src):
                # update_path puts the folder on sys.path, as a code folder usually wants.
                client.register_plugin(UploadDirectory(src, update_path=True,
                                                       skip_words=(".git", "__pycache__")))
            else:
                client.register_plugin(UploadFile(src))
            if dst:
                client.run(_place_upload, os.path.basename(src), dst, os.path.isdir(src))
        return dst or "each worker's local directory"

    @staticmethod
    def rsync_down(src: str, dst: str) -> str:
        """Copy results from storage (a folder or any fsspec URI) to a local folder."""
        import fsspec

        fs, path = fsspec.core.url_to_fs(src)
        if not fs.exists(path):
            raise ValueError(f"rsync-down: nothing at {src}")
        os.makedirs(dst, exist_ok=True)
        target = os.path.join(dst, os.path.basename(path.rstrip("/")))
        fs.get(path, target, recursive=True)
        return target


def _place_upload(name: str, dst: str, is_dir: bool, dask_worker: Any = None) -> str:
    """On a worker: copy an uploaded file or folder from its local directory to ``dst``."""
    import shutil

    src = os.path.join(dask_worker.local_directory, name)
    dst = os.path.expanduser(dst)
    if is_dir:
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        shutil.copy2(src, dst)
    return dst
