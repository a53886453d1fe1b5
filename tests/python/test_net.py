"""Sandbox networks against real kernel networking: a daemon of its own
(pool 10.215.0.0/24, its DNS proxy forwarding to the fake internet's
dnsmasq), sandboxes in modes allow, open and none, phase changes, restarts
and leaks. Everything is sent to loopback, to the node's own addresses or
into the fake internet's namespace (fake_internet.py)."""

import json
import os
import re
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import strata
from conftest import LAUNCHER, _skip_reason, make_node
from fake_internet import ALLOWED_PRIVATE_HOST, NAMES, METADATA_HOST, PRIVATE_HOST, RESOLVER, FakeInternet

POOL = "10.215.0.0/24"
GATEWAY = "10.215.0.1"
TABLE = "strata_10_215_0_0_24"
NETNS = "/run/strata/netns/" + TABLE  # where older daemons bound namespace files


def nft_json(*what):
    out = subprocess.run(["nft", "-j", "list", *what], capture_output=True, text=True)
    return json.loads(out.stdout)["nftables"] if out.returncode == 0 else []


WARM = 4  # the daemon's --net-warm default: namespaces kept ready


def node_leftovers(node, wait=3.0):
    """What of sandbox networks is left on the node beyond its warm
    namespaces: veths of this node (each the node's end of a namespace's:
    the kernel removes it with its namespace, in the background, so this
    waits), namespace files, and per-sandbox rules."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        if os.path.isdir(NETNS):
            left += ["netns file " + n for n in sorted(os.listdir(NETNS))]
        veths = []
        for name in os.listdir("/sys/class/net"):
            try:
                alias = open(f"/sys/class/net/{name}/ifalias").read().strip()
            except OSError:
                continue
            if name.startswith("sx") and alias == TABLE:
                veths.append(name)
        if len(veths) > WARM:
            left += ["interface " + n for n in sorted(veths)]
        left += rule_leftovers()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


# Node-wide sets and maps whose elements are sandboxes'.
PER_SANDBOX = ("ifs4", "src4", "from4", "to4", "cur4", "gen4", "okc4", "noc4", "adm4", "admp4", "net4")


def rule_leftovers():
    left = []
    for item in nft_json("table", "inet", TABLE):
        for kind in ("chain", "set", "counter"):
            name = item.get(kind, {}).get("name", "")
            if re.match(r"^(o|r|n|np|c|cp|ok|no)_[0-9a-f]{12}$", name):
                left.append(f"{kind} {name}")
        for kind in ("set", "map"):
            if item.get(kind, {}).get("name") in PER_SANDBOX and item[kind].get("elem"):
                left.append(f"elements of {item[kind]['name']}")
    return left


@pytest.fixture(scope="module")
def internet():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with FakeInternet(ttl=1) as net:
        yield net


@pytest.fixture(scope="module")
def host_server():
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"the node's own service\n")

    # A server of the node's own, on every address, on a port the kernel picks.
    server = ThreadingHTTPServer(("0.0.0.0", 0), H)
    server.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def net_node(internet):
    n = make_node(extra=["--net-pool", POOL, "--dns-upstream", RESOLVER, "--dns-grace", "1",
                         "--allow-private", "10.99.2.0/24"])
    n.internet = internet
    try:
        yield n
    finally:
        n.cleanup()
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
        subprocess.run(["nft", "delete", "table", "ip", TABLE + "_nat"], capture_output=True)
        subprocess.run(["ip", "addr", "del", GATEWAY + "/32", "dev", "lo"], capture_output=True)
        try:
            os.rmdir(NETNS)
        except OSError:
            pass


@pytest.fixture
def client(net_node):
    with strata.Client(url="unix://" + net_node.socket) as c:
        yield c


def node_address():
    """One of the node's own global addresses (not a sandbox's)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("10.215.") and not addr.startswith("198.18."):
            return addr
    pytest.skip("the node has no global IPv4 address")


def fetch(sb, target, port=80, path="/", timeout=3):
    """HTTP GET from inside the sandbox with busybox nc: (exit code, output)."""
    r = sb.exec(f'printf "GET {path} HTTP/1.0\\r\\n\\r\\n" | nc -w {timeout} {target} {port}', timeout=timeout + 5)
    return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")


def upload_probe(sb):
    """tests/python/net_probe.c, built by CMake, into the sandbox."""
    build = os.environ.get("STRATA_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    with open(os.path.join(build, "tests", "python", "net_probe"), "rb") as f:
        sb.write_file("/tmp/net_probe", f.read(), mode=0o755)
    return "/tmp/net_probe"


def refused(sb, target, port=80):
    """A connect that fails fast, with a refusal (not a hang)."""
    t0 = time.monotonic()
    code, out = fetch(sb, target, port)
    took = time.monotonic() - t0
    assert code != 0 and "refused" in out.lower(), out
    assert took < 2.5, f"a refusal took {took:.1f} s"
    return out


def resolves(sb, name, server=""):
    r = sb.exec(f"nslookup {name} {server}", timeout=10)
    return r.exit_code == 0 and "NXDOMAIN" not in r.stdout.decode() + r.stderr.decode(), (r.stdout + r.stderr).decode()


def test_allowlist(client, net_node, host_server):
    with client.create(layers=["busybox:1"], network="allow",
                       allow=["a.test", f"{RESOLVER}/32", "198.18.1.2:8080"]) as sb, \
         client.create(layers=["busybox:1"], network="allow", allow=["a.test"]) as other:
        info = sb.describe()["network"]
        assert info["mode"] == "allow" and info["allow"] == ["a.test", f"{RESOLVER}", "198.18.1.2:8080"]
        assert sb.exec("cat /etc/resolv.conf").stdout.decode().count(GATEWAY) == 1
        # By name: admitted; another name: NXDOMAIN, without leaving the node.
        code, out = fetch(sb, "a.test")
        assert code == 0 and "hello from 198.18.1.1" in out, out
        ok, out = resolves(sb, "b.test")
        assert not ok and "NXDOMAIN" in out, out
        # b.test's address as a literal: refused on port 80, admitted on 8080 (a CIDR with a port).
        refused(sb, NAMES["b.test"], 80)
        code, out = fetch(sb, NAMES["b.test"], 8080)
        assert code == 0 and "hello from 198.18.1.2" in out, out
        # DNS straight to the resolver, though its address is allowed by CIDR: refused (UDP and TCP).
        ok, out = resolves(sb, "a.test", RESOLVER)
        assert not ok, out
        refused(sb, RESOLVER, 53)
        # UDP: to an admitted address on any port (the entry has none); elsewhere refused.
        udp = upload_probe(sb)
        assert sb.exec([udp, "udp", NAMES["a.test"], "9999", "ping"]).stdout == b"ping\n"
        assert sb.exec([udp, "udp", NAMES["b.test"], "9999", "ping"]).stdout == b"refused\n"
        assert sb.exec([udp, "udp", NAMES["b.test"], "8080", "ping"]).stdout != b"ping\n"
        # ICMP: refused, even to an admitted address.
        r = sb.exec(f"ping -c 1 -W 2 {NAMES['a.test']}", timeout=10)
        assert r.exit_code != 0, r
        # The node: not at its own addresses, not at the gateway (a server on every address).
        assert urlopen_ok(f"http://127.0.0.1:{host_server.port}/")  # (it is there)
        refused(sb, node_address(), host_server.port)
        refused(sb, GATEWAY, host_server.port)
        refused(sb, GATEWAY, 22)
        # Another sandbox: unreachable, while it reaches its own listener.
        other.exec("echo hi > /tmp/index.html; httpd -f -p 7000 -h /tmp", detach=True)
        time.sleep(0.3)
        code, out = fetch(other, "127.0.0.1", 7000)
        assert code == 0 and "hi" in out, out
        refused(sb, other.network()["address"], 7000)
        # Nothing opens a connection into a sandbox, from outside either.
        into = subprocess.run(["ip", "netns", "exec", net_node.internet.ns, "/usr/bin/python3", "-c",
                               "import socket; socket.create_connection((%r, 7000), timeout=3)" % other.network()["address"]],
                              capture_output=True, text=True)
        assert into.returncode != 0 and ("refused" in into.stderr or "timed out" in into.stderr), into.stderr
        # Private and metadata addresses (routed into the fake internet, so a
        # rule that let them through would be seen): refused.
        refused(sb, PRIVATE_HOST, 80)
        refused(sb, METADATA_HOST, 80)
        counters = sb.network()["counters"]
        assert counters["connections_allowed"] >= 3 and counters["connections_refused"] >= 9, counters
        assert counters["names_answered"] >= 1 and counters["names_refused"] >= 1, counters


def urlopen_ok(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status == 200


def test_names_that_resolve_where_sandboxes_never_go(client, net_node):
    with client.create(layers=["busybox:1"], network="allow", allow=["evil.test", "meta.test"]) as sb:
        for name in ("evil.test", "meta.test"):
            assert resolves(sb, name)[0]  # (answered: the policy allows the name)
            refused(sb, name)             # but the address stays refused


def test_a_network_on_every_port_inside_one_on_a_port(client, net_node):
    # The two overlap: the range on its port is kept around the address
    # allowed on every port (a set of ranges takes no overlaps).
    with client.create(layers=["busybox:1"], network="allow", allow=["198.18.1.2/32", "198.18.1.0/30:8080"]) as sb:
        assert fetch(sb, "198.18.1.2", 80)[0] == 0
        assert fetch(sb, "198.18.1.2", 8080)[0] == 0
        assert fetch(sb, "198.18.1.1", 8080)[0] == 0
        assert fetch(sb, "198.18.1.3", 8080)[0] == 0
        refused(sb, "198.18.1.1", 80)
        refused(sb, "198.18.1.3", 80)
    # A network on one port inside one on every port (the kernel refuses the
    # second element of such a pair unless it is cut away).
    with client.create(layers=["busybox:1"], network="allow", allow=["198.18.1.0/30", "198.18.1.2/32:8080"]) as sb:
        assert fetch(sb, "198.18.1.1", 80)[0] == 0
        assert fetch(sb, "198.18.1.2", 8080)[0] == 0


def test_wildcard_and_ttl(client, net_node):
    with client.create(layers=["busybox:1"], network="allow", allow=["*.w.test", "a.test:80"]) as sb:
        code, out = fetch(sb, "one.w.test")
        assert code == 0 and "198.18.1.3" in out, out
        ok, out = resolves(sb, "w.test")  # a wildcard is for the names below it
        assert not ok, out
        # a.test on its port only.
        assert fetch(sb, "a.test", 80)[0] == 0
        refused(sb, "a.test", 8080)
        # dnsmasq answers with a TTL of 1 s and the daemon's grace is 1 s: the
        # window closes after that, and a new lookup opens it again.
        assert resolves(sb, "one.w.test")[0]
        code, out = fetch(sb, "198.18.1.3")
        assert code == 0, out
        time.sleep(3)
        refused(sb, "198.18.1.3")
        assert resolves(sb, "one.w.test")[0]
        assert fetch(sb, "198.18.1.3")[0] == 0


def test_phase_change_cuts_connections(client, net_node):
    with client.create(layers=["busybox:1"], network="allow", allow=["a.test"]) as sb:
        download = sb.exec("wget -O /tmp/slow http://a.test/slow; echo rc=$?", detach=True)
        # (busybox wget segfaults with -q; its progress goes to stderr)
        for _ in range(100):
            if sb.exec("wc -c < /tmp/slow 2>/dev/null || echo 0").stdout.strip() not in (b"", b"0"):
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        policy = sb.set_network("none")
        assert policy["mode"] == "none"
        result = download.wait(timeout=10)
        took = time.monotonic() - t0
        assert b"rc=1" in result.stdout, result
        assert took < 3, f"the download ran on for {took:.1f} s after the change"
        got = int(sb.exec("wc -c < /tmp/slow").stdout)
        assert 0 < got < 1200, got
        # The next connect is refused, and names too.
        refused(sb, NAMES["a.test"])
        assert not resolves(sb, "a.test")[0]
        # Back to allow (through the CLI): works again.
        out = subprocess.run([LAUNCHER, "net", sb.id, "--mode", "allow", "--allow", "a.test", "--socket", net_node.socket],
                             capture_output=True, text=True, env=net_node.env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["allow"] == ["a.test"]
        assert fetch(sb, "a.test")[0] == 0
        # Open connections the new policy still admits are kept.
        download = sb.exec("wget -O /tmp/slow2 http://a.test/slow; echo rc=$?", detach=True)
        time.sleep(0.5)
        sb.set_network("allow", ["a.test", "b.test"])
        time.sleep(1)
        assert download.status()["state"] == "running"
        download.kill()


def test_open_mode(client, net_node, host_server):
    with client.create(layers=["busybox:1"], network="open") as sb:
        code, out = fetch(sb, "b.test")
        assert code == 0 and "198.18.1.2" in out, out
        assert fetch(sb, "198.18.1.4", 8080)[0] == 0
        refused(sb, node_address(), host_server.port)
        refused(sb, GATEWAY, host_server.port)
        refused(sb, PRIVATE_HOST)
        refused(sb, METADATA_HOST)
        # A private range the operator allows (--allow-private 10.99.2.0/24).
        code, out = fetch(sb, ALLOWED_PRIVATE_HOST)
        assert code == 0 and ALLOWED_PRIVATE_HOST in out, out


def test_changes_refused_where_they_cannot_apply(client, net_node, internet):
    with client.create(layers=["busybox:1"]) as sb:
        assert sb.describe()["network"] == {"mode": "none"}
        with pytest.raises(strata.SandboxError) as e:
            sb.set_network("allow", ["a.test"])
        assert e.value.status == 409 and "without an interface" in str(e.value)
        with pytest.raises(strata.SandboxError) as e:
            sb.set_network("host")
        assert e.value.status == 400 and "host's network" in str(e.value)
        with pytest.raises(strata.SandboxError) as e:
            client.create(layers=["busybox:1"], network={"mode": "allow", "allow": ["not a name!"]})
        assert e.value.status == 400 and "not a name" in str(e.value)


def as_older_table():
    """Rewrites the node's table as daemons before 2026-12-03 left it: each
    sandbox with chains of its own (o_KEY, here one that drops all), found
    through a map keyed by its address (out4)."""
    t = f"inet {TABLE}"
    script = f"delete table {t}\nadd table {t}\nadd map {t} out4 {{ type ipv4_addr : verdict; }}\n"
    for item in nft_json("map", "inet", TABLE, "from4"):
        for key, _ in item.get("map", {}).get("elem", []):
            ifname, address = key["concat"]
            chain = "o_" + ifname[len("sx"):]
            script += f"add chain {t} {chain}\nadd rule {t} {chain} drop\n"
            script += f"add element {t} out4 {{ {address} : goto {chain} }}\n"
    assert "add chain" in script
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)


def test_restart_keeps_rules_and_leaves_nothing(client, net_node):
    sb = client.create(layers=["busybox:1"], network="allow", allow=["a.test"])
    try:
        assert fetch(sb, "a.test")[0] == 0
        # The table as an older daemon made it: the restarted daemon moves
        # the sandbox to the maps it uses, in one transaction.
        as_older_table()
        # A half-made sandbox network of a crashed daemon: a veth with this
        # node's alias, never recorded; and a namespace file as daemons
        # before 2026-12 bound them.
        os.makedirs(NETNS, exist_ok=True)
        orphan = os.path.join(NETNS, "sb-0123456789ab")
        open(orphan, "w").close()
        subprocess.run(["unshare", f"--net={orphan}", "true"], check=True)
        subprocess.run(["ip", "link", "add", "sx0123456789ab", "type", "veth", "peer", "name", "sxpeer0"], check=True)
        subprocess.run(["ip", "link", "set", "sx0123456789ab", "alias", TABLE], check=True)
        net_node.restart()
        assert sb.network()["allow"] == ["a.test"]
        assert fetch(sb, "a.test")[0] == 0
        assert not resolves(sb, "b.test")[0]
        refused(sb, NAMES["b.test"])
        assert not os.path.exists(orphan)
        assert not os.path.exists("/sys/class/net/sx0123456789ab")
        names = {item[k]["name"] for item in nft_json("table", "inet", TABLE) for k in ("map", "chain") if k in item}
        assert "from4" in names and "out4" not in names and not [n for n in names if n.startswith("o_")], names
        # Elements of no sandbox (a hand's, or a crash's): the next restart
        # removes them, so no later sandbox on that address inherits them.
        stray = "10.215.0.250"
        subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
            f"add element inet {TABLE} net4 {{ {stray} . 198.18.1.0/24 . 0-65535 }}\n"
            f"add element inet {TABLE} adm4 {{ {stray} . 198.18.1.1 timeout 600s }}\n"
            f"add element inet {TABLE} okc4 {{ {stray} }}\n"))
    finally:
        sb.destroy()
    net_node.restart()
    assert node_leftovers(net_node) == []
    # kill -9 with a live sandbox whose name was looked up and whose policy
    # has a network on a port: the restarted daemon reads its elements back,
    # changes its policy and removes it, to the last element.
    sb = client.create(layers=["busybox:1"], network="allow", allow=["a.test", "198.18.1.2/32:8080"])
    assert fetch(sb, "a.test")[0] == 0
    # (The tests' names live 1 s: an admission as a long TTL leaves it.)
    elem = f"{{ {sb.network()['address']} . {NAMES['a.test']} }}"
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
        f"add element inet {TABLE} adm4 {elem}\ndelete element inet {TABLE} adm4 {elem}\n"
        f"add element inet {TABLE} adm4 {elem[:-1]} timeout 600s }}\n"))
    assert fetch(sb, NAMES["a.test"])[0] == 0
    net_node.restart()
    # What names resolved to goes at a restart (read back, then removed by
    # the adoption); the next lookup admits again.
    refused(sb, NAMES["a.test"])
    assert fetch(sb, "a.test")[0] == 0
    assert fetch(sb, NAMES["b.test"], 8080)[0] == 0
    sb.set_network("allow", ["b.test"])
    refused(sb, NAMES["a.test"])
    refused(sb, NAMES["b.test"], 8080)
    assert fetch(sb, "b.test")[0] == 0
    sb.destroy()
    assert node_leftovers(net_node) == []


def nsfs_mounts():
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if " - nsfs " in line)


def test_create_destroy_loop(client, net_node):
    seen = set()
    mounts = nsfs_mounts()
    for round_ in range(8):
        made = client.create(layers=["busybox:1"], network="allow", allow=["a.test"], count=8)
        assert len(made) == 8, made.failures
        # Namespaces are held by descriptors and processes, never bound in
        # the node's mount table (which every container create copies).
        assert nsfs_mounts() == mounts
        for sb in made:
            seen.add(sb.info["network"]["address"])
        if round_ == 0:
            assert fetch(made[0], "a.test")[0] == 0
        for sb in made:
            sb.destroy()
    # 64 sandboxes, 8 at a time: the addresses are reused.
    assert len(seen) <= 16, sorted(seen)
    assert node_leftovers(net_node) == []


VM_KERNEL = os.environ.get("STRATA_VM_KERNEL", "/var/cache/strata/guest-kernel/vmlinux")


def test_microvm(client, net_node, host_server):
    """A microVM's network: its tap bridged to the sandbox's veth in its
    namespace, so the node's rules and DNS proxy judge it as a container's."""
    if not os.path.exists(VM_KERNEL):
        pytest.skip(f"no guest kernel at {VM_KERNEL} (scripts/guest-kernel)")
    sb = client.create(layers=["busybox:1"], backend="microvm", network="allow", allow=["a.test"], memory=128 << 20)
    try:
        address = sb.network()["address"]
        assert address in sb.exec("ip -4 addr show eth0").stdout.decode()
        assert sb.exec("cat /etc/resolv.conf").stdout.decode().count(GATEWAY) == 1
        code, out = fetch(sb, "a.test")
        assert code == 0 and "hello from 198.18.1.1" in out, out
        ok, out = resolves(sb, "b.test")
        assert not ok and "NXDOMAIN" in out, out
        refused(sb, NAMES["b.test"])
        refused(sb, GATEWAY, host_server.port)
        refused(sb, PRIVATE_HOST)
        # A phase change cuts what the new policy refuses.
        download = sb.exec("wget -O /tmp/slow http://a.test/slow; echo rc=$?", detach=True)
        for _ in range(200):
            if sb.exec("wc -c < /tmp/slow 2>/dev/null || echo 0").stdout.strip() not in (b"", b"0"):
                break
            time.sleep(0.05)
        sb.set_network("none")
        result = download.wait(timeout=10)
        assert b"rc=1" in result.stdout, result
        refused(sb, NAMES["a.test"])
        # The daemon killed and restarted: QEMU keeps its tap, the node its rules.
        sb.set_network("allow", ["b.test"])
        net_node.restart()
        code, out = fetch(sb, "b.test")
        assert code == 0 and "hello from 198.18.1.2" in out, out
        refused(sb, NAMES["a.test"])
        # A second microVM of the stack resumes from the first one's saved
        # state (docs/vmm.md, "Templates") and still takes its own address.
        with client.create(layers=["busybox:1"], backend="microvm", network="allow", allow=["a.test"],
                           memory=128 << 20) as second:
            with open(os.path.join(net_node.root, "run", second.id, "state.json")) as f:
                assert len(json.load(f)["vm"]["template"]) == 32
            assert second.network()["address"] != address
            assert second.network()["address"] in second.exec("ip -4 addr show eth0").stdout.decode()
            assert second.exec("hostname").stdout.decode().strip() == second.id
            code, out = fetch(second, "a.test")
            assert code == 0 and "hello from 198.18.1.1" in out, out
            refused(second, PRIVATE_HOST)
    finally:
        sb.destroy()
    assert node_leftovers(net_node) == []
    qemu = subprocess.run(["pgrep", "-f", f"qemu-system.* -name {sb.id} "], capture_output=True, text=True)
    assert qemu.stdout == "", "QEMU outlived its sandbox: " + qemu.stdout


def test_function_call_pool(client, net_node):
    # (Last: its pool stays warm for a while after, with its network.)
    # A function-call sandbox: its pool's policy, fixed at create.
    with client.create(layers=["busybox:1"], backend="fncall", network="allow", allow=["a.test"]) as call:
        code, out = fetch(call, "a.test")
        assert code == 0 and "198.18.1.1" in out, out
        assert not resolves(call, "b.test")[0]
        with pytest.raises(strata.SandboxError) as e:
            call.set_network("none")
        assert e.value.status == 409
        assert call.network()["mode"] == "allow"
