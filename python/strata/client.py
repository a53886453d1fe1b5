"""The synchronous client: ``strata.Client``, ``Sandbox`` and ``Process``."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import _common as c
from ._common import ExecResult
from .errors import NotFound, SandboxError

_DEFAULT = object()  # the client's own timeout

Output = Callable[[bytes], None]


class Client:
    """A connection pool to one strata node daemon or gateway.

    ``url``: ``http(s)://host:port`` or ``unix:///path`` (default
    ``$STRATA_URL``, else the node's own socket); a list (or commas) names
    several, tried in turn when one does not answer. ``token`` (default
    ``$STRATA_TOKEN``) is sent as a bearer token; ``verify`` is ``True``
    (the system's CAs), a CA file (default ``$STRATA_CA``) or ``False``.
    ``timeout`` bounds each HTTP exchange that is not a running command;
    ``retry_deadline`` bounds the retries of one call (connection errors,
    429 and 503, always with an idempotency key).
    Thread-safe; use it as a context manager or call ``close()``.
    """

    def __init__(self, url: Union[str, Sequence[str], None] = None, token: Optional[str] = None,
                 verify: Union[bool, str, None] = None, timeout: float = 30.0, retry_deadline: float = 60.0):
        self._endpoints = c.endpoints(url)
        self._token = c.default_token(token)
        self._timeout = timeout
        self._retry_deadline = retry_deadline
        verify = c.default_verify(verify)
        self._http = [
            httpx.Client(base_url=e.base_url, transport=httpx.HTTPTransport(uds=e.uds, verify=verify, limits=c.limits()),
                         headers=c.headers(self._token), timeout=httpx.Timeout(timeout), verify=verify)
            for e in self._endpoints
        ]
        self._current = 0

    def close(self) -> None:
        for h in self._http:
            h.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the one place requests go out --------------------------------------

    def _send(self, method: str, path: str, *, body: Any = None, content: Optional[bytes] = None,
              params: Optional[Mapping[str, Any]] = None, key: Optional[str] = None, accept: Optional[str] = None,
              read_timeout: Any = _DEFAULT, sink: Optional[Callable[[bytes], None]] = None,
              retry: bool = True) -> Tuple[int, bytes]:
        """Sends one call, retrying connection errors and 429/503 until the
        deadline (with the same idempotency key). With ``sink`` a 2xx body
        goes to it as it arrives, and a broken stream is not retried."""
        hdrs = {}
        if key:
            hdrs["Idempotency-Key"] = key
        if accept:
            hdrs["Accept"] = accept
        data = json.dumps(body).encode() if body is not None else content
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        # A running command's answer takes as long as the command (None: no bound).
        timeout = None if read_timeout is _DEFAULT else httpx.Timeout(self._timeout, read=read_timeout)
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
            sent = dict(hdrs, **{"X-Strata-Attempt": str(attempt)}) if broken else hdrs
            try:
                kw = {"content": data, "params": params, "headers": sent}
                if timeout is not None:
                    kw["timeout"] = timeout
                with http.stream(method, path, **kw) as response:
                    status = response.status_code
                    if 200 <= status < 300 and sink is not None:
                        started = True
                        for chunk in response.iter_bytes():
                            sink(chunk)
                        return status, b""
                    payload = response.read()
                if status not in c.RETRY_STATUSES or not retry:
                    c.raise_for(status, payload)
                    return status, payload
                retry_after = response.headers.get("retry-after")
            except c.RETRYABLE_ERRORS as e:
                if c.untrusted(e):
                    raise SandboxError(f"strata: {method} {path}: the server's certificate is not trusted ({e})") from e
                if started or not retry:
                    raise SandboxError(f"strata: {method} {path}: the connection broke: {e}") from e
                last_error = e
                retry_after = None
                broken = True
                self._current = (self._current + 1) % len(self._http)  # the next gateway
            except httpx.TimeoutException as e:
                raise c.RequestTimeout(f"strata: {method} {path}: timed out ({e})") from e
            delay = backoff.delay(retry_after)
            if delay is None:
                raise c.give_up(last_error, status, payload)
            time.sleep(delay)

    def _json(self, method: str, path: str, **kw) -> Any:
        status, payload = self._send(method, path, **kw)
        return json.loads(payload or b"{}")

    # -- sandboxes ------------------------------------------------------------

    def create(self, layers: Sequence[str], backend: str = "container", cpus: Optional[float] = None,
               memory: Union[str, int, None] = None, pids: Optional[int] = None, disk: Union[str, int, None] = None,
               network: Union[str, Mapping[str, Any], None] = None, allow: Optional[Sequence[str]] = None,
               env: Union[Mapping[str, str], Sequence[str], None] = None,
               workdir: Optional[str] = None, store: Optional[str] = None, ttl: Optional[float] = None,
               count: Optional[int] = None, deny: Optional[Sequence[str]] = None,
               read_only: Optional[Sequence[str]] = None, kill_leftovers: Optional[bool] = None,
               labels: Optional[Mapping[str, str]] = None, runtime: Optional[str] = None) -> Union["Sandbox", List["Sandbox"]]:
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
        answer = self._json("POST", "/v1/sandboxes", body=body, key=c.new_key())
        if count is None:
            return Sandbox(self, answer)
        made = c.Made(Sandbox(self, info) for info in answer.get("sandboxes", []))
        made.failures = answer.get("failures", [])
        return made

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self, self._json("GET", f"/v1/sandboxes/{sandbox_id}"))

    def list(self) -> List["Sandbox"]:
        return [Sandbox(self, info) for info in self._json("GET", "/v1/sandboxes")]

    def attach(self, sandbox_id: str, exec_id: str) -> "Process":
        """A detached command started elsewhere (another process, before a restart)."""
        return Process(Sandbox(self, {"id": sandbox_id}), exec_id)

    def warm(self, layers: Sequence[str], size: int, cpus: Optional[float] = None, memory: Union[str, int, None] = None,
             pids: Optional[int] = None, disk: Union[str, int, None] = None,
             network: Union[str, Mapping[str, Any], None] = None, allow: Optional[Sequence[str]] = None,
             store: Optional[str] = None, backend: str = "container", runtime: Optional[str] = None) -> Dict[str, Any]:
        """Keeps ``size`` sandboxes of this layer stack, back end (``container``
        or ``microvm``), limits and network ready (a warm pool; 0 removes
        it): a ``create`` with the same ones takes one at once. The node's
        operator only. Returns the pool."""
        body = c.warm_body(layers, size, cpus, memory, pids, disk, c.network_body(network, allow), store, backend, runtime)
        return self._json("POST", "/v1/warm", body=body)

    def warm_pools(self) -> List[Dict[str, Any]]:
        return (self._json("GET", "/v1/warm"))["pools"]

    def health(self) -> Dict[str, Any]:
        return self._json("GET", "/v1/health")


class Sandbox:
    """One sandbox. A context manager that destroys it on exit."""

    def __init__(self, client: Client, info: Mapping[str, Any]):
        self.client = client
        self.info = dict(info)
        self.id: str = info["id"]

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.destroy()
        except NotFound:
            pass

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.id}{rest}"

    def exec(self, cmd: Union[str, Sequence[str]], timeout: Optional[float] = None,
             env: Union[Mapping[str, str], Sequence[str], None] = None, cwd: Optional[str] = None,
             stdin: Union[bytes, str, None] = None, output_cap: Optional[int] = None, on_stdout: Optional[Output] = None,
             on_stderr: Optional[Output] = None, detach: bool = False,
             kill_leftovers: Optional[bool] = None, deny: Optional[Sequence[str]] = None,
             read_only: Optional[Sequence[str]] = None, role: Optional[str] = None) -> Union[ExecResult, "Process"]:
        """Runs ``cmd`` (an argv list, or a string for ``/bin/sh -c``) and
        returns how it ended; a timeout gives ``timed_out=True``, not an
        exception. ``on_stdout``/``on_stderr`` get output as it comes.
        ``detach=True`` returns a ``Process`` at once: the command then
        belongs to the sandbox and survives this client and the daemon."""
        body = c.exec_body(cmd, timeout, env, cwd, stdin, output_cap, detach, kill_leftovers, deny, read_only, role)
        key = c.new_key()
        if detach:
            answer = self.client._json("POST", self._path("/exec"), body=body, key=key)
            return Process(self, answer["exec_id"])
        if on_stdout is None and on_stderr is None:
            body["stream"] = False
            return c.result_of_json(self.client._json("POST", self._path("/exec"), body=body, key=key,
                                                      read_timeout=None if timeout is None else timeout + 30))
        collector = c.NdjsonCollector(on_stdout, on_stderr)
        self.client._send("POST", self._path("/exec"), body=body, key=key, accept="application/x-ndjson",
                          read_timeout=None, sink=collector.feed)
        return collector.result()

    def write_file(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.client._send("PUT", self._path("/files"), content=data, params={"path": path, "mode": f"{mode:o}"})

    def read_file(self, path: str) -> bytes:
        return self.client._send("GET", self._path("/files"), params={"path": path})[1]

    def upload(self, local_dir: str, remote_dir: str) -> int:
        """Copies the tree ``local_dir`` into ``remote_dir`` of the sandbox
        (a tar stream; links are kept as links, and no entry can land outside
        ``remote_dir``). Returns the entries written."""
        data = c.tar_of(local_dir)
        status, payload = self.client._send("PUT", self._path("/files"), content=data,
                                            params={"path": remote_dir, "format": "tar"}, read_timeout=600)
        return int(json.loads(payload or b"{}").get("entries", 0))

    def download(self, remote_dir: str, local_dir: str) -> None:
        """Copies the tree ``remote_dir`` of the sandbox into ``local_dir``;
        links are kept as links and nothing is written outside ``local_dir``."""
        status, payload = self.client._send("GET", self._path("/files"), params={"path": remote_dir, "format": "tar"},
                                            read_timeout=600)
        c.untar_into(payload, local_dir)

    def pause(self) -> None:
        self.client._send("POST", self._path("/pause"), body={})

    def resume(self) -> None:
        self.client._send("POST", self._path("/resume"), body={})

    def snapshot(self, tag: str, exclude: Sequence[str] = (), include_denied: bool = False) -> str:
        """Publishes what the sandbox changed as a diff layer under ``tag``; returns its digest.
        The sandbox's denied paths are left out unless ``include_denied``."""
        body: Dict[str, Any] = {"tag": tag}
        if exclude:
            body["exclude"] = list(exclude)
        if include_denied:
            body["include_denied"] = True
        return self.client._json("POST", self._path("/snapshot"), body=body, key=c.new_key(), read_timeout=600)["digest"]

    def keepalive(self) -> Dict[str, Any]:
        """Renews the ttl; returns the description (``expires_in`` seconds)."""
        self.info = self.client._json("POST", self._path("/keepalive"), body={})
        return self.info

    def describe(self) -> Dict[str, Any]:
        self.info = self.client._json("GET", self._path())
        return self.info

    def execs(self) -> List[Dict[str, Any]]:
        return self.client._json("GET", self._path("/execs"))

    def network(self) -> Dict[str, Any]:
        """The policy, the sandbox's address and its counters."""
        return self.client._json("GET", self._path("/network"))

    def usage(self) -> Dict[str, Any]:
        """What it uses now, as the node sees it: ``time`` (unix seconds),
        ``cpu`` (``seconds`` used since it started, ``limit``), ``memory``
        (``used``, ``cache``, ``limit`` in bytes), ``disk`` (``used``,
        ``limit``). Asking does not renew the ttl."""
        return self.client._json("GET", self._path("/usage"))

    def set_network(self, mode: str = "allow", allow: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """A new policy at once (a task phase): new connections follow it,
        open ones it refuses are reset. Only for a sandbox created with
        ``network="allow"`` or ``"open"``."""
        body = c.network_body(mode, allow) if allow is not None else {"mode": mode}
        return self.client._json("PUT", self._path("/network"), body=body)

    def destroy(self) -> None:
        self.client._send("DELETE", self._path(), key=c.new_key())


class Process:
    """A detached command in a sandbox."""

    def __init__(self, sandbox: Sandbox, exec_id: str):
        self.sandbox = sandbox
        self.id = exec_id

    def __repr__(self) -> str:
        return f"Process({self.sandbox.id!r}, {self.id!r})"

    def _path(self, rest: str = "") -> str:
        return self.sandbox._path(f"/execs/{self.id}{rest}")

    def status(self) -> Dict[str, Any]:
        return self.sandbox.client._json("GET", self._path())

    def output(self, offset: int = 0, stdout_offset: Optional[int] = None,
               stderr_offset: Optional[int] = None, follow: bool = True) -> Iterator[Tuple[str, bytes]]:
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
                with http.stream("GET", self._path("/output"), params=params,
                                 headers={"Accept": "application/x-ndjson"},
                                 timeout=httpx.Timeout(client._timeout, read=None)) as response:
                    if response.status_code != 200:
                        c.raise_for(response.status_code, response.read())
                    for line in response.iter_lines():
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
                time.sleep(delay)
                continue
            except c.RETRYABLE_ERRORS as e:
                delay = backoff.delay(None)
                if delay is None:
                    raise SandboxError(f"strata: output of {self.id}: the connection broke and did not come back: {e}") from e
                client._current = (client._current + 1) % len(client._http)
                time.sleep(delay)
                continue
            if collector.error:
                raise collector.error
            if follow and collector.exit is None:
                # The stream ended early (a restarting daemon): go on from the offsets.
                backoff = c.Backoff(client._retry_deadline)
                time.sleep(0.2)
                continue
            return

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for the command to end (``RequestTimeout`` past ``timeout``)
        and returns how it ended, with its output (up to its caps)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else min(60.0, deadline - time.monotonic())
            if left <= 0:
                raise c.RequestTimeout(f"strata: exec {self.id} still runs after {timeout} s")
            st = self.sandbox.client._json("POST", self._path("/wait"), params={"timeout": f"{left:.3f}"},
                                           read_timeout=left + 30)
            if st.get("state") == "exited":
                break
        out, err = bytearray(), bytearray()
        for stream, data in self.output(follow=False):
            (out if stream == "stdout" else err).extend(data)
        return ExecResult.from_report(st["exit"], bytes(out), bytes(err))

    def signal(self, sig: Union[int, str] = "TERM") -> None:
        self.sandbox.client._send("POST", self._path("/signal"), body={"signal": sig})

    def kill(self) -> None:
        self.signal("KILL")
