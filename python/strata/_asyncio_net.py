"""An httpcore network backend on plain asyncio streams.

httpcore (the HTTP engine python3-httpx is built on) talks to sockets
through a pluggable backend; its own asyncio one goes through anyio, whose
cancel scopes and stream wrappers cost about 0.3 ms a call on this
hardware. The AsyncClient needs nothing anyio offers (it runs on asyncio
only), so it hands httpcore this one. HTTP itself stays httpcore's (h11).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Optional

import httpcore
from httpcore._utils import is_socket_readable
from httpcore.backends.base import AsyncNetworkBackend, AsyncNetworkStream

_LIMIT = 1 << 20  # the stream reader's buffer


async def _bounded(coro, timeout: Optional[float], error):
    try:
        if timeout is None:
            return await coro
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError as e:
        raise error("timed out") from e


class _Stream(AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: Optional[float] = None) -> bytes:
        try:
            return await _bounded(self._reader.read(max_bytes), timeout, httpcore.ReadTimeout)
        except (OSError, ssl.SSLError) as e:
            raise httpcore.ReadError(str(e)) from e

    async def write(self, buffer: bytes, timeout: Optional[float] = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            await _bounded(self._writer.drain(), timeout, httpcore.WriteTimeout)
        except (OSError, ssl.SSLError) as e:
            raise httpcore.WriteError(str(e)) from e

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: Optional[str] = None,
                        timeout: Optional[float] = None) -> AsyncNetworkStream:
        # (StreamWriter.start_tls: Python 3.11.)
        try:
            await _bounded(self._writer.start_tls(ssl_context, server_hostname=server_hostname), timeout,
                           httpcore.ConnectTimeout)
        except (OSError, ssl.SSLError) as e:
            raise httpcore.ConnectError(str(e)) from e
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":  # a kept connection the server closed
            sock = self._writer.get_extra_info("socket")
            return sock is not None and is_socket_readable(sock)
        return None


class AsyncioBackend(AsyncNetworkBackend):
    """Connections for httpcore (which starts TLS on them itself)."""

    async def connect_tcp(self, host: str, port: int, timeout: Optional[float] = None,
                          local_address: Optional[str] = None) -> AsyncNetworkStream:
        try:
            r, w = await _bounded(asyncio.open_connection(host, port, limit=_LIMIT), timeout, httpcore.ConnectTimeout)
        except (OSError, ssl.SSLError) as e:
            raise httpcore.ConnectError(str(e)) from e
        return _Stream(r, w)

    async def connect_unix_socket(self, path: str, timeout: Optional[float] = None) -> AsyncNetworkStream:
        try:
            r, w = await _bounded(asyncio.open_unix_connection(path, limit=_LIMIT), timeout, httpcore.ConnectTimeout)
        except OSError as e:
            raise httpcore.ConnectError(str(e)) from e
        return _Stream(r, w)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
