"""The asyncio client: ``strata.AsyncClient``, ``AsyncSandbox`` and ``AsyncProcess``
(the same calls as the synchronous ones, awaited)."""

from __future__ import annotations

import base64
import json
import asyncio
import time
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import urllib.parse

import httpcore

from . import _common as c
from ._asyncio_net import AsyncioBackend, connection_pool
from ._common import ExecResult
from .errors import NotFound, SandboxError

_DEFAULT = object()  # the client's own timeout

Output = Callable[[bytes], None]


class AsyncClient:
    """An asyncio connection pool to one strata node daemon or gateway (see ``Client``).

    ``url``: ``http(s)://host:port`` or ``unix:///path`` (default
    ``$STRATA_URL``, else the node's own socket); a list (or commas) names
    several, tried in turn when one does not answer. ``token`` (default
    ``$STRATA_TOKEN``) is sent as a bearer token; ``verify`` is ``True``
    (the system's CAs), a CA file (default ``$STRATA_CA``) or ``False``.
    ``timeout`` bounds each HTTP exchange that is not a running command;
    ``retry_deadline`` bounds the retries of one call (connection errors,
    429 and 503, always with an idempotency key).
    Not thread-safe (one event loop); use it as an async context manager or await ``aclose()``.
    """

    def __init__(self, url: Union[str, Sequence[str], None] = None, token: Optional[str] = None,
                 verify: Union[bool, str, None] = None, timeout: float = 30.0, retry_deadline: float = 60.0):
        self._endpoints = c.endpoints(url)
        self._token = c.default_token(token)
        self._timeout = timeout
        self._retry_deadline = retry_deadline
        verify = c.default_verify(verify)
        context = c.ssl_context(verify)
        # httpcore (httpx's engine) directly, on plain asyncio: the httpx
        # client layer and anyio cost a millisecond a call that this SDK
        # does not need (docs/benchmarks.md, "sdk").
        self._http = [
            connection_pool(ssl_context=context, max_connections=1024, max_keepalive_connections=512,
                            keepalive_expiry=30, uds=e.uds, network_backend=AsyncioBackend())
            for e in self._endpoints
        ]
        self._bases = [e.base_url for e in self._endpoints]
        self._headers = [(k.encode(), v.encode()) for k, v in c.headers(self._token).items()]
        self._current = 0

    async def aclose(self) -> None:
        for h in self._http:
            await h.aclose()

    def _url(self, path: str, params: Optional[Mapping[str, Any]]) -> str:
        url = self._bases[self._current] + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return url

    def _extensions(self, read_timeout: Any) -> Dict[str, Any]:
        read = self._timeout if read_timeout is _DEFAULT else read_timeout
        return {"timeout": {"connect": self._timeout, "read": read, "write": self._timeout, "pool": self._timeout}}

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # -- the one place requests go out --------------------------------------

    async def _send(self, method: str, path: str, *, body: Any = None, content: Optional[bytes] = None,
              params: Optional[Mapping[str, Any]] = None, key: Optional[str] = None, accept: Optional[str] = None,
              read_timeout: Any = _DEFAULT, sink: Optional[Callable[[bytes], None]] = None,
              retry: bool = True) -> Tuple[int, bytes]:
        """Sends one call, retrying connection errors and 429/503 until the
        deadline (with the same idempotency key). With ``sink`` a 2xx body
        goes to it as it arrives, and a broken stream is not retried."""
        hdrs = list(self._headers)
        if key:
            hdrs.append((b"Idempotency-Key", key.encode()))
        if accept:
            hdrs.append((b"Accept", accept.encode()))
        data = json.dumps(body).encode() if body is not None else content
        if body is not None:
            hdrs.append((b"Content-Type", b"application/json"))
        # A running command's answer takes as long as the command (None: no bound).
        extensions = self._extensions(read_timeout)
        backoff = c.Backoff(self._retry_deadline)
        last_error: Optional[BaseException] = None
        status, payload = None, b""
        attempt, broken = 0, False
        while True:
            http = self._http[self._current]
            started = False
            attempt += 1
            # A retry after a broken connection says so: a gateway then asks
            # the nodes whether an earlier attempt (maybe through another
            # gateway, one that died) reached one. (After a refusal it
            # did not: nothing to ask.)
            sent = hdrs + [(b"X-Strata-Attempt", str(attempt).encode())] if broken else hdrs
            try:
                async with http.stream(method, self._url(path, params), headers=sent, content=data or b"",
                                       extensions=extensions) as response:
                    status = response.status
                    if 200 <= status < 300 and sink is not None:
                        started = True
                        async for chunk in response.aiter_stream():
                            sink(chunk)
                        return status, b""
                    payload = await response.aread()
                if status not in c.RETRY_STATUSES or not retry:
                    c.raise_for(status, payload)
                    return status, payload
                retry_after = c.header(response.headers, b"retry-after")
            except c.RETRYABLE_CORE_ERRORS as e:
                if c.untrusted(e):
                    raise SandboxError(f"strata: {method} {path}: the server's certificate is not trusted ({e})") from e
                if started or not retry:
                    raise SandboxError(f"strata: {method} {path}: the connection broke: {e}") from e
                last_error = e
                retry_after = None
                broken = True
                self._current = (self._current + 1) % len(self._http)  # the next gateway
            except httpcore.TimeoutException as e:
                raise c.RequestTimeout(f"strata: {method} {path}: timed out ({e})") from e
            delay = backoff.delay(retry_after)
            if delay is None:
                raise c.give_up(last_error, status, payload)
            await asyncio.sleep(delay)

    async def _json(self, method: str, path: str, **kw) -> Any:
        status, payload = await self._send(method, path, **kw)
        return json.loads(payload or b"{}")

    # -- sandboxes ------------------------------------------------------------

    async def create(self, layers: Sequence[str], backend: str = "container", cpus: Optional[float] = None,
               memory: Union[str, int, None] = None, pids: Optional[int] = None, disk: Union[str, int, None] = None,
               network: Union[str, Mapping[str, Any], None] = None, allow: Optional[Sequence[str]] = None,
               env: Union[Mapping[str, str], Sequence[str], None] = None,
               workdir: Optional[str] = None, store: Optional[str] = None, ttl: Optional[float] = None,
               count: Optional[int] = None, deny: Optional[Sequence[str]] = None,
               read_only: Optional[Sequence[str]] = None, kill_leftovers: Optional[bool] = None,
               labels: Optional[Mapping[str, str]] = None, runtime: Optional[str] = None) -> Union["AsyncSandbox", List["AsyncSandbox"]]:
        """Creates a sandbox (a list of ``count`` with ``count``; those that
        failed raise only when none was made). ``ttl``: seconds after the
        last call on it before the node destroys it. ``network``: ``"none"``
        (loopback only, the default), ``"allow"`` with ``allow=[...]``,
        ``"open"`` or ``"host"``. ``runtime``: the OCI runtime of a container
        or fncall sandbox, one the node offers (``"crun"``, its default, or
        ``"runc"``)."""
        body = c.create_body(layers, backend, cpus, memory, pids, disk, c.network_body(network, allow), env, workdir,
                             store, ttl, count, deny, read_only, kill_leftovers, runtime)
        if labels:
            body["labels"] = dict(labels)  # a gateway places on nodes that carry them
        answer = await self._json("POST", "/v1/sandboxes", body=body, key=c.new_key())
        if count is None:
            return AsyncSandbox(self, answer)
        made = c.Made(AsyncSandbox(self, info) for info in answer.get("sandboxes", []))
        made.failures = answer.get("failures", [])
        return made

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, await self._json("GET", f"/v1/sandboxes/{sandbox_id}"))

    async def list(self) -> List["AsyncSandbox"]:
        return [AsyncSandbox(self, info) for info in await self._json("GET", "/v1/sandboxes")]

    def attach(self, sandbox_id: str, exec_id: str) -> "AsyncProcess":
        """A detached command started elsewhere (another process, before a restart)."""
        return AsyncProcess(AsyncSandbox(self, {"id": sandbox_id}), exec_id)

    async def warm(self, layers: Sequence[str], size: int, cpus: Optional[float] = None, memory: Union[str, int, None] = None,
             pids: Optional[int] = None, disk: Union[str, int, None] = None,
             network: Union[str, Mapping[str, Any], None] = None, allow: Optional[Sequence[str]] = None,
             store: Optional[str] = None, backend: str = "container", runtime: Optional[str] = None) -> Dict[str, Any]:
        """Keeps ``size`` sandboxes of this layer stack, back end (``container``
        or ``microvm``), limits and network ready (a warm pool; 0 removes
        it): a ``create`` with the same ones takes one at once. The node's
        operator only. Returns the pool."""
        body = c.warm_body(layers, size, cpus, memory, pids, disk, c.network_body(network, allow), store, backend, runtime)
        return await self._json("POST", "/v1/warm", body=body)

    async def warm_pools(self) -> List[Dict[str, Any]]:
        return (await self._json("GET", "/v1/warm"))["pools"]

    async def health(self) -> Dict[str, Any]:
        return await self._json("GET", "/v1/health")


class AsyncSandbox:
    """One sandbox. An async context manager that destroys it on exit."""

    def __init__(self, client: AsyncClient, info: Mapping[str, Any]):
        self.client = client
        self.info = dict(info)
        self.id: str = info["id"]

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.destroy()
        except NotFound:
            pass

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.id}{rest}"

    async def exec(self, cmd: Union[str, Sequence[str]], timeout: Optional[float] = None,
             env: Union[Mapping[str, str], Sequence[str], None] = None, cwd: Optional[str] = None,
             stdin: Union[bytes, str, None] = None, output_cap: Optional[int] = None, on_stdout: Optional[Output] = None,
             on_stderr: Optional[Output] = None, detach: bool = False,
             kill_leftovers: Optional[bool] = None, deny: Optional[Sequence[str]] = None,
             read_only: Optional[Sequence[str]] = None, role: Optional[str] = None) -> Union[ExecResult, "AsyncProcess"]:
        """Runs ``cmd`` (an argv list, or a string for ``/bin/sh -c``) and
        returns how it ended; a timeout gives ``timed_out=True``, not an
        exception. ``on_stdout``/``on_stderr`` get output as it comes.
        ``detach=True`` returns a ``Process`` at once: the command then
        belongs to the sandbox and survives this client and the daemon."""
        body = c.exec_body(cmd, timeout, env, cwd, stdin, output_cap, detach, kill_leftovers, deny, read_only, role)
        key = c.new_key()
        if detach:
            answer = await self.client._json("POST", self._path("/exec"), body=body, key=key)
            return AsyncProcess(self, answer["exec_id"])
        if on_stdout is None and on_stderr is None:
            body["stream"] = False
            return c.result_of_json(await self.client._json("POST", self._path("/exec"), body=body, key=key,
                                                      read_timeout=None if timeout is None else timeout + 30))
        collector = c.NdjsonCollector(on_stdout, on_stderr)
        await self.client._send("POST", self._path("/exec"), body=body, key=key, accept="application/x-ndjson",
                          read_timeout=None, sink=collector.feed)
        return collector.result()

    async def write_file(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        await self.client._send("PUT", self._path("/files"), content=data, params={"path": path, "mode": f"{mode:o}"})

    async def read_file(self, path: str) -> bytes:
        return (await self.client._send("GET", self._path("/files"), params={"path": path}))[1]

    async def upload(self, local_dir: str, remote_dir: str) -> int:
        """See ``Sandbox.upload``."""
        data = await asyncio.get_running_loop().run_in_executor(None, c.tar_of, local_dir)
        status, payload = await self.client._send("PUT", self._path("/files"), content=data,
                                                  params={"path": remote_dir, "format": "tar"}, read_timeout=600)
        return int(json.loads(payload or b"{}").get("entries", 0))

    async def download(self, remote_dir: str, local_dir: str) -> None:
        """See ``Sandbox.download``."""
        status, payload = await self.client._send("GET", self._path("/files"),
                                                  params={"path": remote_dir, "format": "tar"}, read_timeout=600)
        await asyncio.get_running_loop().run_in_executor(None, c.untar_into, payload, local_dir)

    async def pause(self) -> None:
        await self.client._send("POST", self._path("/pause"), body={})

    async def resume(self) -> None:
        await self.client._send("POST", self._path("/resume"), body={})

    async def snapshot(self, tag: str, exclude: Sequence[str] = (), include_denied: bool = False) -> str:
        """Publishes what the sandbox changed as a diff layer under ``tag``; returns its digest.
        The sandbox's denied paths are left out unless ``include_denied``."""
        body: Dict[str, Any] = {"tag": tag}
        if exclude:
            body["exclude"] = list(exclude)
        if include_denied:
            body["include_denied"] = True
        return (await self.client._json("POST", self._path("/snapshot"), body=body, key=c.new_key(), read_timeout=600))["digest"]

    async def keepalive(self) -> Dict[str, Any]:
        """Renews the ttl; returns the description (``expires_in`` seconds)."""
        self.info = await self.client._json("POST", self._path("/keepalive"), body={})
        return self.info

    async def describe(self) -> Dict[str, Any]:
        self.info = await self.client._json("GET", self._path())
        return self.info

    async def execs(self) -> List[Dict[str, Any]]:
        return await self.client._json("GET", self._path("/execs"))

    async def network(self) -> Dict[str, Any]:
        """The policy, the sandbox's address and its counters."""
        return await self.client._json("GET", self._path("/network"))

    async def usage(self) -> Dict[str, Any]:
        """What it uses now (see the sync client's)."""
        return await self.client._json("GET", self._path("/usage"))

    async def set_network(self, mode: str = "allow", allow: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """A new policy at once (see the sync client's)."""
        body = c.network_body(mode, allow) if allow is not None else {"mode": mode}
        return await self.client._json("PUT", self._path("/network"), body=body)

    async def destroy(self) -> None:
        await self.client._send("DELETE", self._path(), key=c.new_key())


class AsyncProcess:
    """A detached command in a sandbox."""

    def __init__(self, sandbox: AsyncSandbox, exec_id: str):
        self.sandbox = sandbox
        self.id = exec_id

    def __repr__(self) -> str:
        return f"AsyncProcess({self.sandbox.id!r}, {self.id!r})"

    def _path(self, rest: str = "") -> str:
        return self.sandbox._path(f"/execs/{self.id}{rest}")

    async def status(self) -> Dict[str, Any]:
        return await self.sandbox.client._json("GET", self._path())

    async def output(self, offset: int = 0, stdout_offset: Optional[int] = None,
                     stderr_offset: Optional[int] = None, follow: bool = True) -> AsyncIterator[Tuple[str, bytes]]:
        """Yields ``("stdout"|"stderr", bytes)`` from the offsets as the
        command writes, until it ends (``follow``), or what there is now.
        A broken connection is resumed where it stopped."""
        offsets = {"stdout": offset if stdout_offset is None else stdout_offset,
                   "stderr": offset if stderr_offset is None else stderr_offset}
        client = self.sandbox.client
        backoff = c.Backoff(client._retry_deadline)
        while True:
            params = {"stdout_offset": offsets["stdout"], "stderr_offset": offsets["stderr"],
                      "follow": "true" if follow else "false"}
            collector = c.NdjsonCollector(keep=False)
            try:
                http = client._http[client._current]
                partial = b""
                async with http.stream("GET", client._url(self._path("/output"), params),
                                       headers=client._headers + [(b"Accept", b"application/x-ndjson")],
                                       extensions=client._extensions(None)) as response:
                    if response.status != 200:
                        c.raise_for(response.status, await response.aread())
                    async for chunk in response.aiter_stream():
                        lines = (partial + chunk).split(b"\n")
                        partial = lines.pop()
                        for line in lines:
                            if not line.strip():
                                continue
                            j = json.loads(line)
                            for stream in ("stdout", "stderr"):
                                if stream in j:
                                    data = base64.b64decode(j[stream])
                                    offsets[stream] += len(data)
                                    backoff = c.Backoff(client._retry_deadline)  # it flows again
                                    yield stream, data
                            collector.line(j)
            except (c.RateLimited, c.NodeBusy) as e:
                delay = backoff.delay(None)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            except c.RETRYABLE_CORE_ERRORS as e:
                delay = backoff.delay(None)
                if delay is None:
                    raise SandboxError(f"strata: output of {self.id}: the connection broke and did not come back: {e}") from e
                client._current = (client._current + 1) % len(client._http)
                await asyncio.sleep(delay)
                continue
            if collector.error:
                raise collector.error
            if follow and collector.exit is None:
                # The stream ended early (a restarting daemon): go on from the offsets.
                backoff = c.Backoff(client._retry_deadline)
                await asyncio.sleep(0.2)
                continue
            return

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the command to end (``RequestTimeout`` past ``timeout``)
        and returns how it ended, with its output (up to its caps)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else min(60.0, deadline - time.monotonic())
            if left <= 0:
                raise c.RequestTimeout(f"strata: exec {self.id} still runs after {timeout} s")
            st = await self.sandbox.client._json("POST", self._path("/wait"), params={"timeout": f"{left:.3f}"},
                                           read_timeout=left + 30)
            if st.get("state") == "exited":
                break
        out, err = bytearray(), bytearray()
        async for stream, data in self.output(follow=False):
            (out if stream == "stdout" else err).extend(data)
        return ExecResult.from_report(st["exit"], bytes(out), bytes(err))

    async def signal(self, sig: Union[int, str] = "TERM") -> None:
        await self.sandbox.client._send("POST", self._path("/signal"), body={"signal": sig})

    async def kill(self) -> None:
        await self.signal("KILL")
