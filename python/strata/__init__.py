"""strata: the Python SDK of the strata node API (sandboxes for agent training).

    import strata
    with strata.Client("https://node-7:8443", token=..., verify="ca.pem") as client:
        with client.create(layers=["debian:12"], memory="2G", ttl=600) as sb:
            print(sb.exec("echo hi").stdout)

``AsyncClient`` has the same calls for asyncio. See docs/sdk.md.
"""

from ._common import ExecResult
from .aio import AsyncClient, AsyncProcess, AsyncSandbox
from .client import Client, Process, Sandbox
from .errors import (Conflict, ConnectionFailed, Forbidden, NodeBusy, NodeLost, NotFound, RateLimited, RequestTimeout, SandboxError,
                     Unauthorized)

__all__ = [
    "AsyncClient", "AsyncProcess", "AsyncSandbox", "Client", "Conflict", "ConnectionFailed", "ExecResult", "Forbidden",
    "NodeBusy", "NodeLost", "NotFound", "Process", "RateLimited", "RequestTimeout", "Sandbox", "SandboxError", "Unauthorized",
]
__version__ = "0.1.0"
