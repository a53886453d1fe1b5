"""An httpcore network backend on plain asyncio streams.

httpcore (the HTTP engine python3-httpx is built on) talks to sockets
through a pluggable backend; its own asyncio one goes through anyio, whose
cancel scopes and stream wrappers cost about 0.3 ms a call on this
hardware. The AsyncClient needs nothing anyio offers (it runs on asyncio
only), so it hands httpcore this one. HTTP itself stays httpcore's (h11).

httpcore 0.16 also guards its pool and connections with anyio locks, and
under asyncio every anyio lock taken is a cancel-shielded checkpoint: one
more turn of the event loop (an epoll call) each, about ten per request.
``connection_pool()`` gives httpcore's pool with asyncio's locks in those
places (asyncio.Lock takes a free lock without yielding). That reaches
into private attributes of httpcore 0.16 (Debian 12's), so it is done for
that series only; any other httpcore gets its own pool, correct and slower
(tests/python/test_sdk.py checks the locks are swapped here).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Optional

import httpcore
from httpcore._synchronization import AsyncLock as _AnyioLock
from httpcore._utils import is_socket_readable
from httpcore.backends.base import AsyncNetworkBackend, AsyncNetworkStream

_LIMIT = 1 << 20  # the stream reader's buffer
_CORK = 64 << 10  # writes held for the next read, at most


_timeout = getattr(asyncio, "timeout", None)  # Python 3.11


async def _bounded(coro, timeout: Optional[float], error):
    # asyncio.timeout bounds the await in place; wait_for runs it as a task
    # of its own, two more turns of the loop. But 3.11's timeout reports a
    # cancellation as a timeout only when the task has no other pending
    # (one it caught and went on from leaves a count): then wait_for.
    try:
        if timeout is None:
            return await coro
        if _timeout is None or asyncio.current_task().cancelling():
            return await asyncio.wait_for(coro, timeout)
        async with _timeout(timeout):
            return await coro
    except asyncio.TimeoutError as e:
        raise error("timed out") from e


class _Stream(AsyncNetworkStream):
    """An asyncio stream for httpcore. Writes wait (up to _CORK bytes) until
    the next read, so a request's head and body leave in one send, as
    http.client sends them: httpcore writes them apart, and each send is a
    system call here and a wakeup of the daemon there."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._pending: list = []
        self._pending_bytes = 0
        self._write_timeout: Optional[float] = None

    async def read(self, max_bytes: int, timeout: Optional[float] = None) -> bytes:
        if self._pending:
            await self._flush(self._write_timeout)
        try:
            return await _bounded(self._reader.read(max_bytes), timeout, httpcore.ReadTimeout)
        except (OSError, ssl.SSLError) as e:
            raise httpcore.ReadError(str(e)) from e

    async def write(self, buffer: bytes, timeout: Optional[float] = None) -> None:
        if not buffer:
            return
        self._pending.append(buffer)
        self._pending_bytes += len(buffer)
        self._write_timeout = timeout  # (held data goes out under the write's bound)
        if self._pending_bytes >= _CORK:
            await self._flush(timeout)

    async def _flush(self, timeout: Optional[float]) -> None:
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_bytes = [], 0
        try:
            self._writer.write(data)
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


class _Lock:
    """httpcore's lock interface (an async context manager) on asyncio.Lock."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> "_Lock":
        await self._lock.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._lock.release()


def _swap_lock(owner: Any, name: str) -> None:
    # Only a lock of httpcore's own type that nobody holds: httpcore
    # creates these lazily (their anyio lock is made at first use), and
    # every place that takes them is an `async with` that has ended here.
    if type(getattr(owner, name, None)) is _AnyioLock:
        setattr(owner, name, _Lock())


class _Connection(httpcore.AsyncHTTPConnection):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _swap_lock(self, "_request_lock")

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        response = await super().handle_async_request(request)
        # The HTTP/1.1 connection is made by the first request; its state
        # lock is free between its request and the response's close (and
        # no other request can have it: one at a time on HTTP/1.1, which is
        # all the SDK speaks; an HTTP/2 connection keeps its anyio locks).
        connection = getattr(self, "_connection", None)
        if isinstance(connection, httpcore.AsyncHTTP11Connection):
            _swap_lock(connection, "_state_lock")
        return response


class _ConnectionPool(httpcore.AsyncConnectionPool):

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _swap_lock(self, "_pool_lock")

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        return _Connection(origin=origin, ssl_context=self._ssl_context, keepalive_expiry=self._keepalive_expiry,
                           http1=self._http1, http2=self._http2, retries=self._retries,
                           local_address=self._local_address, uds=self._uds, network_backend=self._network_backend)


def connection_pool(**kwargs: Any) -> httpcore.AsyncConnectionPool:
    """httpcore's connection pool, with asyncio locks on httpcore 0.16 (see the module's doc)."""
    # (HTTP/1.1 only: an HTTP/2 connection's locks are shared by its
    # streams, so they may be held when the swap would happen. The stream's
    # write cork assumes HTTP/1.1 as well; the SDK never asks for HTTP/2.)
    if httpcore.__version__.startswith("0.16.") and not kwargs.get("http2"):
        return _ConnectionPool(**kwargs)
    return httpcore.AsyncConnectionPool(**kwargs)
