"""What the sync and async clients share: configuration, requests as data,
answers to results or typed errors, the retry policy."""

from __future__ import annotations

import base64
import json
import os
import random
import shlex
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from .errors import ConnectionFailed, NodeBusy, RateLimited, RequestTimeout, SandboxError, error_for

DEFAULT_URL = "unix:///run/strata/launcher.sock"
# Connection errors and these statuses are retried (with the same
# idempotency key), with jittered exponential backoff, until the deadline.
RETRY_STATUSES = (429, 503)


@dataclass
class ExecResult:
    """How a command ended, with its output (up to its output cap)."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    signal: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0  # seconds

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.signal

    @classmethod
    def from_report(cls, report: Mapping[str, Any], stdout: bytes = b"", stderr: bytes = b"") -> "ExecResult":
        return cls(
            exit_code=int(report.get("exit_code", -1)),
            stdout=stdout,
            stderr=stderr,
            signal=int(report.get("signal", 0)),
            timed_out=bool(report.get("timed_out", False)),
            oom_killed=bool(report.get("oom_killed", False)),
            stdout_truncated=bool(report.get("stdout_truncated", False)),
            stderr_truncated=bool(report.get("stderr_truncated", False)),
            duration=float(report.get("duration_ms", 0)) / 1000.0,
        )


@dataclass
class Endpoint:
    """One daemon or gateway: how httpx reaches it."""

    base_url: str
    uds: Optional[str] = None


def endpoints(url: Union[str, Sequence[str], None]) -> List[Endpoint]:
    if url is None:
        url = os.environ.get("STRATA_URL") or DEFAULT_URL
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
    out = []
    for u in urls:
        if u.startswith("unix://"):
            out.append(Endpoint("http://launcher", u[len("unix://"):]))
        elif u.startswith("http://") or u.startswith("https://"):
            out.append(Endpoint(u.rstrip("/")))
        else:
            raise ValueError(f"strata: URL {u!r} is neither http(s)://HOST:PORT nor unix:///PATH")
    if not out:
        raise ValueError("strata: no URL given")
    return out


def default_token(token: Optional[str]) -> Optional[str]:
    return token if token is not None else os.environ.get("STRATA_TOKEN") or None


def default_verify(verify: Union[bool, str, None]) -> Union[bool, str]:
    if verify is None:
        return os.environ.get("STRATA_CA") or True
    return verify


def limits() -> httpx.Limits:
    # Hundreds of episodes at once, each with a call in flight.
    return httpx.Limits(max_connections=1024, max_keepalive_connections=512, keepalive_expiry=30)


def headers(token: Optional[str]) -> Dict[str, str]:
    h = {"User-Agent": "strata-python/0.1"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def new_key() -> str:
    return uuid.uuid4().hex


def argv_of(cmd: Union[str, Sequence[str]]) -> List[str]:
    """A string runs under /bin/sh -c; a list is the argv itself."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = [str(a) for a in cmd]
    if not argv:
        raise ValueError("strata: empty command")
    return argv


def network_body(network: Union[str, Mapping[str, Any], None], allow: Optional[Sequence[str]]) -> Any:
    """``"none"``/``"open"``/``"host"``, or ``"allow"`` with entries (domains,
    ``*.domain``, addresses, CIDRs, each with an optional ``:port``)."""
    if allow is not None:
        if isinstance(allow, str):
            allow = [allow]
        if network not in (None, "allow"):
            raise ValueError(f"strata: an allow list needs network='allow', not {network!r}")
        return {"mode": "allow", "allow": list(allow)}
    return network


def create_body(layers: Sequence[str], backend: str, cpus: Optional[float], memory: Union[str, int, None],
                pids: Optional[int], disk: Union[str, int, None], network: Any,
                env: Union[Mapping[str, str], Sequence[str], None], workdir: Optional[str], store: Optional[str],
                ttl: Optional[float], count: Optional[int], deny: Optional[Sequence[str]] = None,
                read_only: Optional[Sequence[str]] = None, kill_leftovers: Optional[bool] = None,
                runtime: Optional[str] = None) -> Dict[str, Any]:
    if isinstance(layers, str):
        layers = [layers]
    body: Dict[str, Any] = {"layers": list(layers), "backend": backend}
    for k, v in (("cpus", cpus), ("memory", memory), ("pids", pids), ("disk", disk), ("network", network),
                 ("workdir", workdir), ("store", store), ("ttl", ttl), ("count", count), ("runtime", runtime)):
        if v is not None:
            body[k] = v
    if env:
        body["env"] = env_list(env)
    files = files_body(deny, read_only)
    if files:
        body["files"] = files
    if kill_leftovers is not None:
        body["kill_leftovers"] = bool(kill_leftovers)
    return body


def warm_body(layers: Sequence[str], size: int, cpus: Optional[float], memory: Union[str, int, None], pids: Optional[int],
              disk: Union[str, int, None], network: Any, store: Optional[str], backend: str = "container",
              runtime: Optional[str] = None) -> Dict[str, Any]:
    body = create_body(layers, backend, cpus, memory, pids, disk, network, None, None, store, None, None, runtime=runtime)
    body["size"] = int(size)
    return body


def files_body(deny: Optional[Sequence[str]], read_only: Optional[Sequence[str]]) -> Optional[Dict[str, List[str]]]:
    """The API's file rules: paths hidden from commands, paths they may not change."""
    if isinstance(deny, str):
        deny = [deny]
    if isinstance(read_only, str):
        read_only = [read_only]
    if not deny and not read_only:
        return None
    return {"deny": list(deny or []), "read_only": list(read_only or [])}


def env_list(env: Union[Mapping[str, str], Sequence[str], None]) -> List[str]:
    if not env:
        return []
    if isinstance(env, Mapping):
        return [f"{k}={v}" for k, v in env.items()]
    return list(env)


def exec_body(cmd, timeout, env, cwd, stdin, output_cap, detach, kill_leftovers, deny=None, read_only=None,
              role=None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"argv": argv_of(cmd)}
    if timeout is not None:
        body["timeout"] = float(timeout)
    if env:
        body["env"] = env_list(env)
    if cwd is not None:
        body["cwd"] = cwd
    if stdin is not None:
        if isinstance(stdin, str):
            stdin = stdin.encode()
        body["stdin"] = base64.b64encode(stdin).decode()
    if output_cap is not None:
        body["output_cap"] = int(output_cap)
    if detach:
        body["detach"] = True
    if kill_leftovers is not None:
        body["kill_leftovers"] = bool(kill_leftovers)
    files = files_body(deny, read_only)
    if files:
        body["files"] = files
    if role is not None:
        body["role"] = role
    return body


def raise_for(response_status: int, body: bytes) -> None:
    if 200 <= response_status < 300:
        return
    message, errno, node = f"HTTP {response_status}", None, None
    try:
        j = json.loads(body or b"{}")
        message = j.get("error", message)
        errno = j.get("errno")
        node = j.get("node")
    except (ValueError, AttributeError):
        if body:
            message = f"HTTP {response_status}: {body[:200]!r}"
    raise error_for(response_status, message, errno, node)


def result_of_json(j: Mapping[str, Any]) -> ExecResult:
    return ExecResult.from_report(j, base64.b64decode(j.get("stdout", "")), base64.b64decode(j.get("stderr", "")))


class NdjsonCollector:
    """Reads an NDJSON exec stream: output to the callbacks and buffers, then the exit."""

    def __init__(self, on_stdout=None, on_stderr=None, keep=True):
        self.on = {"stdout": on_stdout, "stderr": on_stderr}
        self.keep = keep
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.exit: Optional[Dict[str, Any]] = None
        self.error: Optional[SandboxError] = None
        self.running = False
        self.offsets = {"stdout": 0, "stderr": 0}
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self.line(json.loads(line))

    def line(self, j: Mapping[str, Any]) -> None:
        for stream in ("stdout", "stderr"):
            if stream in j:
                b = base64.b64decode(j[stream])
                self.offsets[stream] += len(b)
                if self.keep:
                    self.out[stream] += b
                if self.on[stream]:
                    self.on[stream](b)
        if "exit" in j:
            self.exit = j["exit"]
        if "error" in j:
            self.error = error_for(500, j["error"], j.get("errno"))
        if j.get("state") == "running":
            self.running = True

    def result(self) -> ExecResult:
        if self.error:
            raise self.error
        if self.exit is None:
            raise SandboxError("strata: the exec's answer ended without an exit report")
        return ExecResult.from_report(self.exit, bytes(self.out["stdout"]), bytes(self.out["stderr"]))


class Made(list):
    """The sandboxes a bulk create made; ``failures`` lists the others
    (``{"index", "error", "errno"}``)."""
    failures: List[Dict[str, Any]] = []


def untrusted(e: BaseException) -> bool:
    """Whether a connection failed on the server's certificate (not worth retrying)."""
    import ssl
    seen = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def tar_of(local_dir: str) -> bytes:
    """The tree below ``local_dir`` as a tar (names relative to it; links kept)."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(local_dir)):
            tar.add(os.path.join(local_dir, name), arcname=name, recursive=True)
    return buf.getvalue()


def untar_into(data: bytes, local_dir: str) -> None:
    """Unpacks a tar into ``local_dir`` without writing outside it: names
    with ".." or absolute ones, and links that lead out, are refused
    (tarfile's "data" filter where the Python has it, else the same checks here)."""
    import io
    import tarfile
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            try:
                tar.extractall(local_dir, filter="data")
            except tarfile.FilterError as e:
                raise SandboxError(f"strata: download: {e}") from e
            return
        for m in tar.getmembers():
            target = os.path.realpath(os.path.join(root, m.name))
            if m.name.startswith("/") or ".." in m.name.split("/") or not (target == root or target.startswith(root + os.sep)):
                raise SandboxError(f"strata: download: entry {m.name!r} would land outside {local_dir}")
            if m.issym() or m.islnk():
                base = root if m.islnk() else os.path.dirname(target)
                dest = os.path.realpath(os.path.join(base, m.linkname))
                if m.linkname.startswith("/") or not (dest == root or dest.startswith(root + os.sep)):
                    raise SandboxError(f"strata: download: link {m.name!r} -> {m.linkname!r} leads outside {local_dir}")
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                continue
            tar.extract(m, local_dir, set_attrs=m.isfile() or m.isdir())


class Backoff:
    """Full-jitter exponential backoff within a deadline."""

    def __init__(self, deadline: float, initial: float = 0.1, cap: float = 5.0):
        self.deadline = time.monotonic() + deadline
        self.initial, self.cap, self.attempt = initial, cap, 0

    def delay(self, retry_after: Optional[str]) -> Optional[float]:
        """Seconds to wait before the next attempt, or None when the deadline leaves no room."""
        self.attempt += 1
        d = random.uniform(0, min(self.cap, self.initial * (2 ** (self.attempt - 1))))
        if retry_after:
            try:
                d = max(d, float(retry_after))
            except ValueError:
                pass
        if time.monotonic() + d >= self.deadline:
            return None
        return d

    def left(self) -> float:
        return self.deadline - time.monotonic()


def give_up(last: Optional[BaseException], status: Optional[int], body: bytes) -> SandboxError:
    if status in RETRY_STATUSES:
        try:
            raise_for(status, body)
        except (RateLimited, NodeBusy) as e:
            return e
    if last is not None:
        return ConnectionFailed(f"strata: no daemon answered: {last}")
    return RequestTimeout("strata: the call's deadline passed")


def ssl_context(verify: Union[bool, str]):
    import ssl
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()


def header(headers, name: bytes) -> Optional[str]:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


import httpcore as _httpcore  # noqa: E402

RETRYABLE_CORE_ERRORS = (_httpcore.ConnectError, _httpcore.ConnectTimeout, _httpcore.RemoteProtocolError,
                         _httpcore.ReadError, _httpcore.WriteError, _httpcore.PoolTimeout)

RETRYABLE_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                    httpx.WriteError, httpx.PoolTimeout)
