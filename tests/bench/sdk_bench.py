"""scripts/bench sdk: the Python SDK against a real daemon, each row beside
a baseline measured in the same run.
  - `exec true` through AsyncClient over the unix socket and over TLS,
    against a raw keep-alive http.client connection sending the same
    request on the same transport (interleaved, one call at a time);
  - 256 episodes at once (create -> 5 x exec -> destroy) through
    AsyncClient, against the same episodes through the CLI verbs at the
    same concurrency: sandboxes per second and p99 episode time.
Usage: /usr/bin/python3 tests/bench/sdk_bench.py [CALLS] [EPISODES]"""

import asyncio
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import conftest  # noqa: E402  (the tests' Node: a daemon of its own)
import strata  # noqa: E402
from bench_table import pct, table  # noqa: E402


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("launcher")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


async def exec_rows(node, calls):
    rows = []
    body = json.dumps({"argv": ["true"], "stream": False}).encode()
    for name, kw, raw in [
        ("unix socket", {"url": "unix://" + node.socket}, lambda: UnixHTTPConnection(node.socket)),
        ("TLS (loopback)", {"url": node.https, "token": node.tenant, "verify": node.cert},
         lambda: http.client.HTTPSConnection("127.0.0.1", int(node.https.rsplit(":", 1)[1]),
                                             context=ssl.create_default_context(cafile=node.cert))),
    ]:
        async with strata.AsyncClient(**kw) as client:
            sb = await client.create(layers=["busybox:1"])
            conn = raw()
            headers = {"Content-Type": "application/json"}
            if kw.get("token"):
                headers["Authorization"] = "Bearer " + kw["token"]

            def raw_exec():
                conn.request("POST", f"/v1/sandboxes/{sb.id}/exec", body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                assert r.status == 200, data

            for _ in range(5):
                await sb.exec(["true"])
                raw_exec()
            ours, base = [], []
            for _ in range(calls):
                t = time.perf_counter()
                r = await sb.exec(["true"])
                ours.append((time.perf_counter() - t) * 1000)
                assert r.exit_code == 0
                t = time.perf_counter()
                raw_exec()
                base.append((time.perf_counter() - t) * 1000)
            conn.close()
            await sb.destroy()
        rows.append([name, f"{pct(ours, 50):.3f}", f"{pct(ours, 99):.3f}", f"{pct(base, 50):.3f}", f"{pct(base, 99):.3f}",
                     f"{pct(ours, 50) - pct(base, 50):+.3f}"])
    return rows


async def sdk_episodes(node, n):
    times = []
    async with strata.AsyncClient(node.https, token=node.tenant, verify=node.cert) as client:
        async def episode(i):
            t = time.perf_counter()
            sb = await client.create(layers=["busybox:1"], ttl=600)
            for k in range(5):
                r = await sb.exec(["echo", str(k)])
                assert r.stdout == f"{k}\n".encode()
            await sb.destroy()
            times.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*[episode(i) for i in range(n)])
        return n / (time.perf_counter() - t0), pct(times, 99)


async def cli_episodes(node, n):
    times = []
    flags = ["--url", node.https, "--token", node.tenant, "--ca", node.cert]

    async def run(*args):
        p = await asyncio.create_subprocess_exec(conftest.LAUNCHER, args[0], *flags, *args[1:], stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.PIPE, env=node.env)
        out, err = await p.communicate()
        assert p.returncode == 0, err
        return out

    async def episode(i):
        t = time.perf_counter()
        sid = (await run("create", "--layer", "busybox:1")).decode().strip()
        for k in range(5):
            assert await run("exec", sid, "--", "echo", str(k)) == f"{k}\n".encode()
        await run("destroy", sid)
        times.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*[episode(i) for i in range(n)])
    return n / (time.perf_counter() - t0), pct(times, 99)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    episodes = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    reason = conftest._skip_reason()
    if reason:
        sys.exit(f"sdk_bench: {reason}")
    node = conftest.make_node(["--max-connections-per-client", "2048", "--max-connections", "4096"])
    try:
        print(f"sdk_bench: exec rows ({calls} calls each)...", file=sys.stderr)
        rows = asyncio.run(exec_rows(node, calls))
        print(f"sdk_bench: {episodes} episodes through the SDK...", file=sys.stderr)
        sdk_rate, sdk_p99 = asyncio.run(sdk_episodes(node, episodes))
        print(f"sdk_bench: {episodes} episodes through the CLI...", file=sys.stderr)
        cli_rate, cli_p99 = asyncio.run(cli_episodes(node, episodes))
    finally:
        node.cleanup()
    print(f"Python SDK, exec true: {calls} calls each, interleaved with the baseline, one at a time")
    table(["transport", "AsyncClient p50 ms", "p99 ms", "raw http.client p50 ms", "p99 ms", "SDK adds (p50 ms)"], rows)
    print(f"\n{episodes} episodes at once (create -> 5 x exec -> destroy), over TLS with a token")
    table(["client", "sandboxes/s", "p99 episode s", "baseline", "baseline sandboxes/s", "baseline p99 s", "rate ratio"],
          [["AsyncClient", f"{sdk_rate:.1f}", f"{sdk_p99:.2f}", "CLI verbs (launcher create/exec/destroy)",
            f"{cli_rate:.1f}", f"{cli_p99:.2f}", f"{sdk_rate / cli_rate:.2f}"]])


if __name__ == "__main__":
    main()
