"""The SDK against a real daemon, on TLS with a tenant's token and on the
unix socket as root: every call sync and async, detached commands across
dropped clients and daemon restarts, retries across a daemon crash, ttl."""

import asyncio
import os
import socket
import threading
import time

import pytest

import httpcore

import strata
from strata import _asyncio_net


def test_every_call_sync(node, target):
    with strata.Client(**target) as client:
        assert client.health()["ok"]
        with client.create(layers=["busybox:1"], memory="64M", env={"GREETING": "hi"}, workdir="/tmp", ttl=600) as sb:
            assert sb.id.startswith("sb-")
            assert sb.id in [s.id for s in client.list()]
            assert client.get(sb.id).info["layers"][0]["name"] == "busybox"
            # A string runs under sh -c; a list is the argv.
            r = sb.exec("echo $GREETING from $(pwd); echo oops >&2; exit 3")
            assert (r.exit_code, r.stdout, r.stderr) == (3, b"hi from /tmp\n", b"oops\n")
            assert not r.ok
            assert sb.exec(["cat"], stdin=b"\x00\xffbytes").stdout == b"\x00\xffbytes"
            assert sb.exec(["pwd"], cwd="/etc").stdout == b"/etc\n"
            assert sb.exec(["sh", "-c", "echo $X"], env={"X": "y"}).stdout == b"y\n"
            slow = sb.exec("sleep 30", timeout=1)
            assert slow.timed_out
            big = sb.exec("head -c 100000 /dev/zero", output_cap=1000)
            assert len(big.stdout) == 1000 and big.stdout_truncated
            seen = []
            r = sb.exec("echo a; sleep 0.5; echo b", on_stdout=seen.append)
            assert b"".join(seen) == b"a\nb\n" and r.stdout == b"a\nb\n"
            # Files.
            sb.write_file("/root/note", b"kept", mode=0o600)
            assert sb.read_file("/root/note") == b"kept"
            assert sb.exec("stat -c %a /root/note").stdout == b"600\n"
            with pytest.raises(strata.SandboxError):
                sb.read_file("/no/such/file")
            # Pause: an exec is a conflict until resumed.
            sb.pause()
            with pytest.raises(strata.Conflict):
                sb.exec("true")
            sb.resume()
            assert sb.exec("cat /root/note").stdout == b"kept"
            # What it uses, against its limits.
            usage = sb.usage()
            assert usage["memory"]["limit"] == 64 << 20 and 0 < usage["memory"]["used"] <= 64 << 20
            assert usage["cpu"]["seconds"] > 0 and "used" in usage["disk"]  # (btrfs counts writes at its next commit)
            # Lifetime.
            info = sb.keepalive()
            assert info["ttl"] == 600 and 590 < info["expires_in"] <= 600
            # A snapshot starts new sandboxes where this one left off.
            digest = sb.snapshot(f"pytest-snap-{int(time.time() * 1000)}:1" if target["token"] is None else "trainer-snap:1")
            assert len(digest) == 32
            # Detached.
            p = sb.exec("echo started; sleep 1; echo done; exit 5", detach=True)
            assert isinstance(p, strata.Process)
            assert p.status()["state"] in ("running", "exited")
            r = p.wait(timeout=30)
            assert (r.exit_code, r.stdout) == (5, b"started\ndone\n")
            assert [e["id"] for e in sb.execs()] == [p.id]
            q = sb.exec("sleep 60", detach=True)
            q.kill()
            assert q.wait(timeout=10).signal == 9
        with pytest.raises(strata.NotFound):
            client.get(sb.id)
        # Bulk.
        many = client.create(layers=["busybox:1"], count=3)
        assert len(many) == 3 and len({s.id for s in many}) == 3
        for s in many:
            s.destroy()


def test_every_call_async(node, target):
    async def main():
        async with strata.AsyncClient(**target) as client:
            assert (await client.health())["ok"]
            async with await client.create(layers=["busybox:1"], env={"A": "1"}) as sb:
                assert sb.id in [s.id for s in await client.list()]
                assert (await client.get(sb.id)).id == sb.id
                r = await sb.exec("echo $A; exit 2")
                assert (r.exit_code, r.stdout) == (2, b"1\n")
                assert (await sb.exec(["cat"], stdin=b"in")).stdout == b"in"
                assert (await sb.exec("sleep 30", timeout=1)).timed_out
                got = []
                await sb.exec("echo x >&2", on_stderr=got.append)
                assert got == [b"x\n"]
                await sb.write_file("/root/f", "text")
                assert await sb.read_file("/root/f") == b"text"
                await sb.pause()
                with pytest.raises(strata.Conflict):
                    await sb.exec("true")
                await sb.resume()
                await sb.keepalive()
                assert (await sb.usage())["cpu"]["seconds"] > 0
                p = await sb.exec("for i in 1 2 3; do echo $i; sleep 0.2; done", detach=True)
                pieces = [data async for stream, data in p.output()]
                assert b"".join(pieces) == b"1\n2\n3\n"
                r = await p.wait(timeout=10)
                assert r.stdout == b"1\n2\n3\n" and r.exit_code == 0
                assert (await client.attach(sb.id, p.id).status())["state"] == "exited"
                # Many calls at once share the pool.
                results = await asyncio.gather(*[sb.exec(["echo", str(i)]) for i in range(32)])
                assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(32)]
                # A body past the stream's cork (64 KiB) leaves at once; a small one with the next read.
                big = os.urandom(300_000)
                await sb.write_file("/root/big", big)
                assert await sb.read_file("/root/big") == big
            with pytest.raises(strata.NotFound):
                await client.get(sb.id)

    asyncio.run(main())


def test_errors_are_typed(node):
    with strata.Client(node.https, token="st_" + "0" * 64, verify=node.cert) as bad:
        with pytest.raises(strata.Unauthorized):
            bad.list()
    with strata.Client(node.https, token=node.tenant, verify=node.cert) as mine, \
            strata.Client(node.https, token=node.other, verify=node.cert) as theirs:
        with mine.create(layers=["busybox:1"]) as sb:
            with pytest.raises(strata.NotFound):
                theirs.get(sb.id)
            with pytest.raises(strata.NotFound):
                theirs.attach(sb.id, "ex-1").status()
            # Publishing: only under the tenant's publish patterns, so never over
            # a shared tag; a tenant without patterns may not publish at all.
            with pytest.raises(strata.Forbidden):
                sb.snapshot("busybox:1")
        with theirs.create(layers=["busybox:1"]) as other_sb:
            with pytest.raises(strata.Forbidden):
                other_sb.snapshot("other-snap:1")
        with pytest.raises(strata.Forbidden):
            mine.create(layers=["busybox:1"], network="host")
        with pytest.raises(strata.Forbidden):
            mine.create(layers=["busybox:1"], store="file:///etc")
    # Nobody answering: a clear error once the deadline passes.
    with strata.Client("http://127.0.0.1:9", retry_deadline=1) as nobody:
        with pytest.raises(strata.ConnectionFailed):
            nobody.list()
    # The untrusted certificate is refused.
    with strata.Client(node.https, token=node.tenant, retry_deadline=1) as untrusted:
        with pytest.raises(Exception):
            untrusted.list()


def test_a_detached_command_outlives_its_client_and_a_daemon_crash(node):
    """A 30 s command: its first client goes away, the daemon is killed and
    restarted, a second client attaches at an offset and waits: the output
    is complete and in order."""
    url = dict(url=node.https, token=node.tenant, verify=node.cert)
    first = strata.Client(**url)
    sb = first.create(layers=["busybox:1"])
    p = sb.exec("i=0; while [ $i -lt 30 ]; do echo line $i; i=$((i+1)); sleep 1; done; echo end >&2", detach=True)
    seen = b""
    for stream, data in p.output():
        seen += data
        if seen.count(b"\n") >= 3:
            break
    first.close()  # the client goes away mid-stream
    time.sleep(1)
    node.restart()  # kill -9 and start again
    with strata.Client(**url) as second:
        again = second.attach(sb.id, p.id)
        assert again.status()["state"] == "running"
        rest = b"".join(data for stream, data in again.output(stdout_offset=len(seen), stderr_offset=0) if stream == "stdout")
        assert seen + rest == b"".join(f"line {i}\n".encode() for i in range(30))
        result = again.wait(timeout=60)
        assert result.exit_code == 0
        assert result.stdout == seen + rest and result.stderr == b"end\n"
        second.get(sb.id).destroy()


def test_retries_across_a_daemon_crash_make_nothing_twice(node):
    """Creates and execs in a loop while the daemon is killed and restarted:
    every call succeeded once or raised, and the node holds exactly the
    sandboxes the loop was told of."""
    made, errors = [], []
    stop = threading.Event()

    def loop():
        with strata.Client(node.https, token=node.tenant, verify=node.cert, retry_deadline=60) as client:
            while not stop.is_set():
                try:
                    sb = client.create(layers=["busybox:1"])
                    made.append(sb)
                    assert sb.exec(["echo", sb.id]).stdout == sb.id.encode() + b"\n"
                except strata.SandboxError as e:
                    errors.append(e)

    before = {s["id"] for s in node.sandboxes()}
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(2)
    node.restart()
    time.sleep(2)
    stop.set()
    t.join(timeout=120)
    assert not t.is_alive()
    on_node = {s["id"] for s in node.sandboxes()} - before
    assert on_node == {s.id for s in made}, (on_node, [s.id for s in made], errors)
    assert len(made) >= 2
    with strata.Client(node.https, token=node.tenant, verify=node.cert) as client:
        for sb in made:
            client.get(sb.id).destroy()


def test_a_ttl_destroys_a_forgotten_sandbox(node):
    with strata.Client("unix://" + node.socket) as client:
        sb = client.create(layers=["busybox:1"], ttl=1)
        kept = client.create(layers=["busybox:1"], ttl=600)
        # (A describe is a call that renews the ttl; the list is not.)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sb.id in [s.id for s in client.list()]:
            time.sleep(0.5)
        with pytest.raises(strata.NotFound):
            client.get(sb.id)
        assert client.get(kept.id).info["expires_in"] > 500
        kept.destroy()


def test_trees_move_as_tar_and_never_land_outside(node, tmp_path):
    import io
    import os
    import tarfile
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print('a')\n")
    (src / "pkg" / "sub" / "b.bin").write_bytes(bytes(range(256)) * 1000)
    os.chmod(src / "pkg" / "a.py", 0o755)
    os.symlink("a.py", src / "pkg" / "link")
    with strata.Client(node.https, token=node.tenant, verify=node.cert) as client, \
            client.create(layers=["busybox:1"]) as sb:
        assert sb.upload(str(src), "/work") >= 5
        assert sb.exec("cat /work/pkg/link; stat -c %a /work/pkg/a.py; wc -c < /work/pkg/sub/b.bin").stdout == b"print('a')\n755\n256000\n"
        out = tmp_path / "out"
        sb.download("/work", str(out))
        assert (out / "pkg" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 1000
        assert os.readlink(out / "pkg" / "link") == "a.py"

        # A hostile archive: a link out of the target, then an entry through it,
        # and names with "..": nothing is written outside /work.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            link = tarfile.TarInfo("escape")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc"
            tar.addfile(link)
            for name in ("escape/passwd", "../outside", "ok/../../outside2"):
                data = b"owned\n"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        with pytest.raises(strata.SandboxError):
            client._send("PUT", f"/v1/sandboxes/{sb.id}/files", content=buf.getvalue(), params={"path": "/work", "format": "tar"})
        assert sb.read_file("/etc/passwd") == b"root:x:0:0:root:/root:/bin/sh\n"
        assert sb.exec("ls /outside /outside2 2>&1; ls /work").stdout.count(b"No such file") == 2

        # A download of a tree whose links lead out writes nothing outside.
        sb.exec("mkdir -p /trap && ln -s /etc /trap/etc && ln -s ../../../../tmp /trap/up")
        with pytest.raises(Exception):
            sb.download("/trap", str(tmp_path / "trap"))
        assert not (tmp_path / "trap" / "etc" / "passwd").exists()


def test_leftovers_keep_running_unless_asked(node):
    with strata.Client("unix://" + node.socket) as client, client.create(layers=["busybox:1"]) as sb:
        # By default what a command starts in the background outlives it
        # (the exec ends 50 ms after the command while it holds the pipes).
        r = sb.exec("sleep 300 > /dev/null 2>&1 & echo started")
        assert r.stdout == b"started\n"
        assert b"sleep 300" in sb.exec("ps -o args").stdout
        sb.exec("pkill -f 'sleep 300'")
        # With kill_leftovers its process group goes with it, detached or not.
        sb.exec("sleep 301 > /dev/null 2>&1 & echo started", kill_leftovers=True)
        p = sb.exec("sleep 302 > /dev/null 2>&1 & echo started", detach=True, kill_leftovers=True)
        assert p.wait(timeout=10).exit_code == 0
        procs = sb.exec("ps -o args").stdout
        assert b"sleep 301" not in procs and b"sleep 302" not in procs, procs


def test_a_missing_program_is_a_bad_request_not_a_missing_sandbox(node):
    with strata.Client("unix://" + node.socket) as client, client.create(layers=["busybox:1"]) as sb:
        for detach in (False, True):
            with pytest.raises(strata.SandboxError) as e:
                sb.exec(["/no/such/program"], detach=detach)
            assert not isinstance(e.value, strata.NotFound) and e.value.status == 400 and e.value.errno == 2
            assert "/no/such/program" in e.value.message
        # A large file comes back whole (streamed from the agent).
        data = bytes(range(256)) * 20000
        sb.write_file("/root/big", data)
        assert sb.read_file("/root/big") == data
        with pytest.raises(strata.NotFound):
            sb.read_file("/root/missing")


def test_grader_files_and_whole_tree_leftovers(node):
    with strata.Client("unix://" + node.socket) as client:
        with client.create(layers=["busybox:1"], deny=["/grader"], read_only=["/etc"], kill_leftovers=True) as sb:
            assert sb.info["files"] == {"deny": ["/grader"], "read_only": ["/etc"]}
            sb.write_file("/grader/answer", b"42\n")
            # The agent's commands neither read nor change; the grader's exec reads.
            assert sb.exec("cat /grader/answer || echo refused").stdout == b"refused\n"
            assert sb.exec("touch /etc/x || echo refused").stdout == b"refused\n"
            assert sb.exec(["cat", "/grader/answer"], role="grader").stdout == b"42\n"
            # An exec's own rules add to the sandbox's.
            assert sb.exec("ls -A /root; echo listed", deny=["/root"]).stdout == b"listed\n"
            with pytest.raises(strata.SandboxError) as e:
                sb.exec("true", role="judge")
            assert "judge" in e.value.message
            # The sandbox's default kills the whole tree, also what left the session.
            sb.exec("setsid sleep 311 > /dev/null 2>&1 & echo started")
            assert b"sleep 311" not in sb.exec("ps -o args").stdout
            sb.exec("setsid sleep 312 > /dev/null 2>&1 &", kill_leftovers=False)
            assert b"sleep 312" in sb.exec("ps -o args").stdout


def test_a_warm_pool_serves_the_creates_that_match(node):
    with strata.Client("unix://" + node.socket) as client:
        pool = client.warm(["busybox:1"], 2, memory="48M")
        try:
            deadline = time.time() + 60
            while time.time() < deadline and pool["ready"] < 2:
                time.sleep(0.1)
                pool = next(p for p in client.warm_pools() if p["name"] == pool["name"])
            assert pool["ready"] == 2, pool
            with client.create(layers=["busybox:1"], memory="48M", env={"WHO": "pooled"}) as sb:
                assert sb.info["warm_pool"] == pool["name"] and sb.info["internal_id"] != sb.id
                assert sb.exec("echo $WHO").stdout == b"pooled\n"
            # A tenant neither sets nor lists pools, but its creates may take from them.
            with strata.Client(node.https, token=node.tenant, verify=node.cert) as tenant:
                with pytest.raises(strata.SandboxError) as e:
                    tenant.warm_pools()
                assert e.value.status == 403
        finally:
            client.warm(["busybox:1"], 0, memory="48M")
        deadline = time.time() + 60
        while time.time() < deadline and client.warm_pools():
            time.sleep(0.1)
        assert client.warm_pools() == []


def test_the_async_pool_takes_asyncio_locks_and_keeps_its_timeouts(node):
    """On Debian's httpcore (0.16) the AsyncClient's pool and connections hold
    asyncio locks, not anyio's (docs/benchmarks.md, "sdk"); a server that
    never answers still times out at the client's timeout."""

    async def main():
        async with strata.AsyncClient("unix://" + node.socket) as client:
            async with await client.create(layers=["busybox:1"]) as sb:
                await asyncio.gather(*[sb.exec("true") for _ in range(4)])
                pool = client._http[0]
                if httpcore.__version__.startswith("0.16."):
                    assert type(pool._pool_lock) is _asyncio_net._Lock
                    assert pool.connections
                    for conn in pool.connections:
                        assert type(conn._request_lock) is _asyncio_net._Lock
                        assert type(conn._connection._state_lock) is _asyncio_net._Lock
        with socket.socket() as mute:
            mute.bind(("127.0.0.1", 0))
            mute.listen()
            url = "http://127.0.0.1:%d" % mute.getsockname()[1]
            async with strata.AsyncClient(url, timeout=0.5, retry_deadline=0) as client:
                started = time.monotonic()
                with pytest.raises(strata.RequestTimeout):
                    # (wait_for: a broken timeout fails here, not hangs the suite)
                    await asyncio.wait_for(client.health(), 10)
                assert time.monotonic() - started < 5

                # A task that once caught a cancellation and went on still
                # gets RequestTimeout (Python 3.11's asyncio.timeout would
                # report a CancelledError there).
                async def after_a_swallowed_cancel():
                    asyncio.current_task().cancel()
                    try:
                        await asyncio.sleep(1)
                    except asyncio.CancelledError:
                        pass
                    await client.health()

                with pytest.raises(strata.RequestTimeout):
                    await asyncio.wait_for(after_a_swallowed_cancel(), 10)

    asyncio.run(main())
