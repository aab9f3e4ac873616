"""SpotInterruptionPlugin: a metadata server on 127.0.0.1 starts announcing an interruption
mid-run; the worker is retired gracefully and its data moves to another worker."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from distributed import Client, Scheduler, Worker

from dasktune.cluster.spot import SpotInterruptionPlugin, notice_url, read_notice


class _Metadata:
    """404 until ``notice`` is set, then the notice body. ``token``: AWS IMDSv2, where a GET
    without the session token from ``PUT /latest/api/token`` is refused with 401; without
    it the server speaks only IMDSv1 (no PUT). ``google``: GCP, the Metadata-Flavor header
    is required."""

    TOKEN = "imds-session-token"

    def __init__(self, body: bytes, *, token: bool = False, google: bool = False) -> None:
        self.notice = threading.Event()
        self.hits = 0
        self.refused = 0
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):  # noqa: N802 - http.server's spelling
                if (not token or self.path != "/latest/api/token"
                        or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")):
                    self.send_error(400 if token else 405)
                    return
                self.send_response(200)
                self.end_headers()
                self.wfile.write(meta.TOKEN.encode())

            def do_GET(self):  # noqa: N802 - http.server's spelling
                if ((token and self.headers.get("X-aws-ec2-metadata-token") != meta.TOKEN)
                        or (google and self.headers.get("Metadata-Flavor") != "Google")):
                    meta.refused += 1
                    self.send_error(401 if token else 403)
                    return
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
        path = ("/latest/meta-data/spot/instance-action" if not google
                else "/computeMetadata/v1/instance/preempted")
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("provider, body", [
    ("aws", b'{"action": "terminate", "time": "2026-12-02T20:00:00Z"}'),
    ("gcp", b"TRUE"),
])
def test_notice_retires_the_worker_and_moves_its_data(provider, body):
    # AWS: an instance that requires IMDSv2, as new EC2 instances do by default.
    meta = _Metadata(body, token=provider == "aws", google=provider == "gcp")

    async def run() -> None:
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            # Each poll's HTTP timeout is min(2 s, interval): 0.25 s, not 0.05 s, so that a
            # busy CI machine does not time out the IMDSv2 token request (a poll without
            # its token, which the server refuses).
            plugin = SpotInterruptionPlugin(url=meta.url, provider=provider, interval=0.25)
            async with Worker(s.address, nthreads=1, plugins={plugin}) as spot, \
                    Worker(s.address, nthreads=1) as other, \
                    Client(s.address, asynchronous=True) as client:
                fut = client.submit(lambda: 42, workers=[spot.address], pure=False)
                assert await fut == 42
                while meta.hits < 2:  # polling, no notice yet: the worker stays
                    await asyncio.sleep(0.02)
                assert spot.address in s.workers
                assert meta.refused == 0  # each poll carried the token / header
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


@pytest.mark.parametrize("token", [True, False], ids=["imdsv2", "imdsv1-only"])
def test_aws_notice_read_with_or_without_a_token(token):
    """IMDSv2 when the server issues a token; a server without the token endpoint (IMDSv1
    only) is still read."""
    meta = _Metadata(b'{"action": "stop"}', token=token)
    try:
        assert read_notice(meta.url, "aws", timeout=2.0) is False  # 404: no notice yet
        meta.notice.set()
        assert read_notice(meta.url, "aws", timeout=2.0) is True
        assert meta.hits == 2 and meta.refused == 0
    finally:
        meta.close()
