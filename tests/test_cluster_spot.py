"""SpotInterruptionPlugin: a metadata server on 127.0.0.1 starts announcing an interruption
mid-run; the worker is retired gracefully and its data moves to another worker."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from distributed import Client, Scheduler, Worker

from dasktune.cluster.spot import SpotInterruptionPlugin, notice_url


class _Metadata:
    """AWS-style: 404 until ``notice`` is set, then the instance-action JSON (or GCP TRUE)."""

    def __init__(self, body: bytes) -> None:
        self.notice = threading.Event()
        self.hits = 0
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's spelling
                meta.hits += 1
                if meta.notice.is_set():
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notice"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("provider, body", [
    ("aws", b'{"action": "terminate", "time": "2026-12-02T20:00:00Z"}'),
    ("gcp", b"TRUE"),
])
def test_notice_retires_the_worker_and_moves_its_data(provider, body):
    meta = _Metadata(body)

    async def run() -> None:
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            plugin = SpotInterruptionPlugin(url=meta.url, provider=provider, interval=0.05)
            async with Worker(s.address, nthreads=1, plugins={plugin}) as spot, \
                    Worker(s.address, nthreads=1) as other, \
                    Client(s.address, asynchronous=True) as client:
                fut = client.submit(lambda: 42, workers=[spot.address], pure=False)
                assert await fut == 42
                while meta.hits < 2:  # polling, no notice yet: the worker stays
                    await asyncio.sleep(0.02)
                assert spot.address in s.workers
                meta.notice.set()
                for _ in range(400):
                    if spot.address not in s.workers:
                        break
                    await asyncio.sleep(0.025)
                assert spot.address not in s.workers
                assert other.address in s.workers
                assert await fut == 42  # replicated to `other` before the worker left
                assert s.tasks[fut.key].who_has == {s.workers[other.address]}

    try:
        asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        meta.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="provider must be one of"):
        SpotInterruptionPlugin(provider="azure")
    with pytest.raises(ValueError, match="interval must be > 0"):
        SpotInterruptionPlugin(interval=0)
    assert notice_url("aws").endswith("/spot/instance-action")
    assert notice_url("gcp").endswith("/instance/preempted")
