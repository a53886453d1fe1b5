"""Typed errors of the strata SDK: one class per answer a caller acts on."""

from __future__ import annotations

from typing import Optional


class SandboxError(Exception):
    """A call failed; ``message`` is the server's (it names the object and the step)."""

    def __init__(self, message: str, status: Optional[int] = None, errno: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.errno = errno


class Unauthorized(SandboxError):
    """401: no token, or one the node does not know (unknown or revoked)."""


class Forbidden(SandboxError):
    """403: the tenant may not use that store, layer or network."""


class NotFound(SandboxError):
    """404: no such sandbox (or another tenant's), exec or API."""


class Conflict(SandboxError):
    """409: the sandbox's state refuses it (e.g. an exec in a paused sandbox)."""


class RateLimited(SandboxError):
    """429: a tenant limit (sandboxes at once, creations per second). Retried until the deadline."""


class NodeBusy(SandboxError):
    """503: the node cannot take more now. Retried until the deadline."""


class NodeLost(NodeBusy):
    """503 from a cluster gateway: the node that holds the sandbox is lost
    (its lease expired) or cannot be reached; ``node`` names it. Retried
    until the deadline: a node that comes back re-adopts its sandboxes."""

    def __init__(self, message: str, status: Optional[int] = None, errno: Optional[int] = None, node: str = ""):
        super().__init__(f"{message} (node {node})" if node else message, status, errno)
        self.node = node


class RequestTimeout(SandboxError):
    """The call's own deadline passed (retries included)."""


class ConnectionFailed(SandboxError):
    """No daemon answered at any of the client's URLs until the deadline."""


_BY_STATUS = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 429: RateLimited, 503: NodeBusy}


def error_for(status: int, message: str, errno: Optional[int] = None, node: Optional[str] = None) -> SandboxError:
    if status == 503 and node:
        return NodeLost(message, status, errno, node)
    return _BY_STATUS.get(status, SandboxError)(message, status, errno)
