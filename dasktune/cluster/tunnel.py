"""Port forwarding through the scheduler's Dask comms: ``dasktune exec --port-forward``.

A port on the head (the scheduler's machine: TensorBoard, Jupyter) is made reachable at a
local port where ``dasktune`` runs, over the same connection kind a client already has to
the scheduler (tcp or tls, with the cluster's certificates): no SSH. :class:`TunnelPlugin`
adds the handler :data:`OP` to the scheduler; each local connection accepted by
:class:`PortForward` opens a new comm to the scheduler, asks for ``127.0.0.1:PORT`` there,
and both ends relay bytes (:func:`relay`) until either side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from distributed.comm import connect
from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin

if TYPE_CHECKING:
    from distributed.comm import Comm
    from distributed.security import Security

logger = logging.getLogger(__name__)

__all__ = ["OP", "PortForward", "TunnelPlugin", "parse_forward", "relay"]

OP = "dasktune_tunnel"
_CHUNK = 64 * 1024


def parse_forward(text: str) -> tuple[int, int]:
    """``"6006"`` -> (6006, 6006); ``"16006:6006"`` -> (local 16006, head 6006)."""
    local, _, remote = text.partition(":")
    try:
        ports = (int(local), int(remote or local))
    except ValueError:
        raise ValueError(f"--port-forward {text!r}: expected PORT or LOCAL:REMOTE") from None
    if not all(0 < p < 65536 for p in ports):
        raise ValueError(f"--port-forward {text!r}: ports must be in 1-65535")
    return ports


async def relay(comm: Comm, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
    """Copy bytes both ways between a socket and a Dask comm; ``b""`` marks end of stream."""

    async def to_comm() -> None:
        while data := await reader.read(_CHUNK):
            await comm.write(data)
        await comm.write(b"")

    async def to_socket() -> None:
        while data := await comm.read():
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    tasks = [asyncio.ensure_future(to_comm()), asyncio.ensure_future(to_socket())]
    try:
        # Both directions end on their own (half-close); an error on either ends both.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        pass
    finally:
        for t in tasks:
            t.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await comm.close()


async def _open_on_head(comm: Comm, port: int) -> Status:
    """Scheduler handler: connect to ``127.0.0.1:port`` and relay the comm to it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        await comm.write({"error": f"nothing answers on port {port} of the head ({e})"})
        await comm.close()
        return Status.dont_reply
    await comm.write({"ok": True})
    await relay(comm, reader, writer)
    return Status.dont_reply


class TunnelPlugin(SchedulerPlugin):
    """Adds the :data:`OP` handler to the scheduler (``dasktune`` must be importable there)."""

    idempotent = True
    name = "dasktune-tunnel"

    async def start(self, scheduler: Any) -> None:
        scheduler.handlers[OP] = _open_on_head


class PortForward:
    """Listens on ``127.0.0.1:local`` for each ``(local, remote)`` and relays every
    connection to ``remote`` on the head through ``address`` (a thread of its own)."""

    def __init__(self, address: str, forwards: list[tuple[int, int]],
                 security: Security | None = None) -> None:
        self.address, self.forwards = address, list(forwards)
        self._conn_args = security.get_connection_args("client") if security else {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="dasktune-port-forward")
        self._servers: list[asyncio.AbstractServer] = []

    def start(self) -> None:
        """Listen on every local port (raises if one is taken)."""
        self._thread.start()
        for local, remote in self.forwards:
            fut = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(lambda r, w, p=remote: self._handle(r, w, p),
                                     "127.0.0.1", local), self._loop)
            try:
                self._servers.append(fut.result(10))
            except OSError as e:
                self.stop()
                raise ValueError(f"--port-forward: cannot listen on localhost:{local} "
                                 f"({e.strerror or e})") from None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      port: int) -> None:
        try:
            comm = await connect(self.address, **self._conn_args)
            await comm.write({"op": OP, "port": port, "reply": False})
            answer = await comm.read()
        except Exception as e:  # noqa: BLE001 - one refused connection, not the command
            logger.warning("port forward to %d: %s", port, e)
            writer.close()
            return
        if "error" in answer:
            logger.warning("port forward: %s", answer["error"])
            writer.close()
            await comm.close()
            return
        await relay(comm, reader, writer)

    def stop(self) -> None:
        """Stop listening and drop open connections."""
        async def close() -> None:
            for s in self._servers:
                s.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
