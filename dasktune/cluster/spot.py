"""Graceful retirement of spot / preemptible workers when the cloud announces the end.

AWS gives about two minutes' notice at ``/latest/meta-data/spot/instance-action`` (404 until
then; read with an IMDSv2 token, plain IMDSv1 if no token is issued); GCP about 30 s at
``/computeMetadata/v1/instance/preempted`` (``TRUE`` once preempted).
The plugin polls that URL on each worker and, on a notice, asks the scheduler to retire the
worker, so its tasks and trial actors move before the VM disappears.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dasktune.cluster.retire import retire_gracefully

logger = logging.getLogger(__name__)

__all__ = ["SpotInterruptionPlugin", "notice_url", "read_notice"]

_URLS = {
    "aws": "http://169.254.169.254/latest/meta-data/spot/instance-action",
    "gcp": "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
}
_TOKEN_PATH = "/latest/api/token"  # AWS IMDSv2, on the same server as the notice


def notice_url(provider: str) -> str:
    """The metadata URL that announces an interruption on ``provider`` ("aws" or "gcp")."""
    try:
        return _URLS[provider]
    except KeyError:
        raise ValueError(f"provider must be one of {sorted(_URLS)}, got {provider!r}") from None


def _imds_token(url: str, timeout: float) -> str | None:
    """An IMDSv2 session token from the metadata server that serves ``url``, or None.

    Instances that require IMDSv2 answer 401 to a plain GET; ones that only speak IMDSv1
    (or a server without the token endpoint) fail the PUT, and the GET goes without it.
    """
    parts = urllib.parse.urlsplit(url)
    token_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, _TOKEN_PATH, "", ""))
    req = urllib.request.Request(token_url, method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - fixed URL
            return resp.read().decode().strip() or None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def read_notice(url: str, provider: str, timeout: float) -> bool:
    """Whether the metadata server currently announces an interruption (blocking)."""
    if provider == "gcp":
        headers = {"Metadata-Flavor": "Google"}
    else:
        token = _imds_token(url, timeout)
        headers = {"X-aws-ec2-metadata-token": token} if token else {}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - fixed URL
            body = resp.read().decode(errors="replace").strip()
    except (urllib.error.URLError, OSError, ValueError):
        return False  # 404 (AWS: no notice yet) or metadata unreachable
    if provider == "gcp":
        return body.upper() == "TRUE"
    return bool(body)  # AWS: {"action": "terminate", "time": ...}


class SpotInterruptionPlugin(WorkerPlugin):
    """Poll the interruption notice every ``interval`` seconds; retire the worker on one.

    ``url`` overrides the provider's metadata URL (tests serve a notice on 127.0.0.1).
    """

    name = "dasktune-spot-interruption"

    def __init__(self, url: str | None = None, provider: str = "aws",
                 interval: float = 5.0) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self.url = url or notice_url(provider)
        self.provider = notice_url(provider) and provider
        self.interval = float(interval)
        self._task: asyncio.Task[None] | None = None

    def setup(self, worker: Any = None, **kwargs: Any) -> None:
        self._task = asyncio.ensure_future(self._watch(worker))

    def teardown(self, worker: Any = None, **kwargs: Any) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, worker: Any) -> None:
        loop = asyncio.get_running_loop()
        timeout = min(2.0, self.interval)
        while True:
            noticed = await loop.run_in_executor(
                None, read_notice, self.url, self.provider, timeout)
            if noticed:
                break
            await asyncio.sleep(self.interval)
        await retire_gracefully(worker, "interruption notice")
