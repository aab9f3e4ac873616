"""Shared parts of the S3 tests (no tests here): moto's S3 server over HTTP on 127.0.0.1,
a TCP proxy that can take the endpoint down, and S3 filesystems aimed at either.

Credentials are dummies in the environment (the usual place), set in the driver and in
every worker process of a cluster, since workers do not inherit changes made after
they started.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
for _k, _v in AWS_ENV.items():
    os.environ.setdefault(_k, _v)


def s3_options(endpoint: str, **extra: Any) -> dict[str, Any]:
    """``storage_options`` for the test endpoint.

    botocore's and s3fs's own retries are cut to one quick try so that dasktune's
    retry budget (``dasktune.storage.retries``) is what an outage meets; listings are
    not cached across instances.
    """
    return {
        "client_kwargs": {"endpoint_url": endpoint},
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                          "connect_timeout": 1, "read_timeout": 5},
        "skip_instance_cache": True,
        **extra,
    }


def s3_fs(endpoint: str) -> Any:
    return s3fs.S3FileSystem(**s3_options(endpoint))


def set_worker_env(client: Any, env: dict[str, str]) -> None:
    """Put ``env`` into every worker process (credentials live in the environment)."""

    def _set(env: dict[str, str] = env) -> None:
        os.environ.update(env)

    client.run(_set)


def set_worker_config(client: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """``dask.config.set`` inside every worker process; returns the previous values."""
    import dask.config

    def _set(settings: dict[str, Any] = settings) -> dict[str, Any]:
        import dask.config as dc

        old = {k: dc.get(k, None) for k in settings}
        dc.set(settings)
        return old

    olds = client.run(_set)
    dask.config.set(settings)  # the driver too
    return next(iter(olds.values())) if olds else {}


def set_s3fs_retries(client: Any, n: int) -> int:
    """s3fs's own retry count (a class attribute, not an init argument), in the workers
    and the driver; returns the previous one. One try leaves the budget to dasktune."""

    def _set(n: int = n) -> int:
        import s3fs as _s3fs

        old = _s3fs.S3FileSystem.retries
        _s3fs.S3FileSystem.retries = n
        return old

    client.run(_set)
    return _set()


class MotoS3:
    """moto's S3 server, in this process, reached over HTTP like a real endpoint."""

    def __init__(self) -> None:
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0,
                                                     verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.port = port

    def new_bucket(self) -> str:
        name = f"dt-{uuid.uuid4().hex[:10]}"
        s3_fs(self.endpoint).mkdir(name)
        return name

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    yield server
    server.stop()


class TcpProxy:
    """A TCP relay to ``upstream`` that can be taken down and brought back.

    Down, it resets every open connection and every new one (what a client sees
    from a load balancer with no healthy backend); the listening port stays the same,
    so clients need no new endpoint.
    """

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.up = threading.Event()
        self.up.set()
        self.refused = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    @staticmethod
    def _reset(conn: socket.socket) -> None:
        try:  # SO_LINGER 0: close with RST, like a refused/reset connection
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self.up.is_set():
                self.refused += 1
                self._reset(conn)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._reset(conn)
                continue
            with self._lock:
                self._open.update((conn, upstream))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            for s in (src, dst):
                try:  # wake the other direction's pump too
                    s.shutdown(socket.SHUT_RD)
                except OSError:
                    pass
                s.close()

    def down(self) -> None:
        self.up.clear()
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            # Abort, don't close: closing a socket another thread blocks on leaves the
            # connection open. SHUT_RD wakes the pump, which closes it (RST, linger 0).
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def back(self) -> None:
        self.up.set()

    def close(self) -> None:
        self._closed = True
        self.down()
        self.sock.close()


class MotoProcess:
    """moto's S3 server in a process of its own, for tests that measure this process's
    memory: an in-process server would count the objects it stores as ours."""

    def __init__(self) -> None:
        import subprocess
        import sys

        from conftest import free_port, wait_for

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"moto server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout=60, what="moto server process to listen")

    def new_bucket(self) -> str:
        name = f"dt-{uuid.uuid4().hex[:10]}"
        s3_fs(self.endpoint).mkdir(name)
        return name

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def moto_s3_process() -> Iterator[MotoProcess]:
    server = MotoProcess()
    yield server
    server.stop()


# ------------------------------------------------------------------ the stores under test
# gcsfs reads this at import: its experimental (HNS) client does not talk to the emulator.
# Set here, at collection, so the embedded cluster's workers inherit it too.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


class GcsEmulator:
    """``gcp-storage-emulator`` over HTTP on a free port, in a process of its own."""

    def __init__(self) -> None:
        import subprocess
        import sys

        from conftest import free_port, wait_for

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()",
             "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "-q"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"GCS emulator exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout=60, what="the GCS emulator to listen")

    def stop(self) -> None:
        self.proc.kill()  # only the process this fixture started
        self.proc.wait()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    server = GcsEmulator()
    yield server
    server.stop()


class S3Store:
    """moto's S3 server as the tests' object store."""

    scheme = "s3"

    def __init__(self, server: MotoS3) -> None:
        self.endpoint, self.port, self._server = server.endpoint, server.port, server
        self.env = AWS_ENV

    def new_bucket(self) -> str:
        return self._server.new_bucket()

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return s3_options(endpoint or self.endpoint)

    def fs(self) -> Any:
        return s3_fs(self.endpoint)

    def fs_code(self) -> str:
        """Python that makes ``fs`` in a fresh process."""
        return f"import s3fs\nfs = s3fs.S3FileSystem(**{self.options()!r})"

    def set_retries(self, client: Any, n: int | None) -> int | None:
        return set_s3fs_retries(client, n) if n is not None else None


class GcsStore:
    """The GCS emulator as the tests' object store: gcsfs finds it through
    ``STORAGE_EMULATOR_HOST`` (in the driver and every worker), or ``endpoint_url``."""

    scheme = "gs"

    def __init__(self, server: GcsEmulator) -> None:
        self.endpoint, self.port = server.endpoint, server.port
        self.env = {"STORAGE_EMULATOR_HOST": server.endpoint}

    def new_bucket(self) -> str:
        name = f"dt-{uuid.uuid4().hex[:10]}"
        self.fs().mkdir(name)
        return name

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        opts: dict[str, Any] = {"token": "anon", "project": "dasktune-test",
                                "skip_instance_cache": True}
        if endpoint is not None:  # else STORAGE_EMULATOR_HOST
            opts["endpoint_url"] = endpoint
        return opts

    def fs(self) -> Any:
        import gcsfs

        os.environ.update(self.env)
        return gcsfs.GCSFileSystem(**self.options())

    def fs_code(self) -> str:
        return f"import gcsfs\nfs = gcsfs.GCSFileSystem(**{self.options(self.endpoint)!r})"

    def set_retries(self, client: Any, n: int | None) -> int | None:
        return None  # gcsfs fixes its retries (6, with backoff) when it is imported
