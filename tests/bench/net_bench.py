"""scripts/bench net: sandbox networks against baselines measured in the
same run, on the tests' fake internet (tests/python/fake_internet.py):
  - create -> exec true -> destroy, p50 and p90, with network "none" and
    with "allow" (interleaved);
  - TCP connect p50 to an allowed host from a sandbox (through the policy,
    NAT and conntrack) against the same connects from a namespace of the
    bench's own with a plain veth route and no rules;
  - one 64 MiB download from the fake internet in a sandbox against the
    same download on the node itself;
  - DNS answers per second through the node's proxy (from a sandbox,
    32 queries in flight) against the same queries sent to the upstream
    resolver straight from the node.
Usage: /usr/bin/python3 tests/bench/net_bench.py [CYCLES]"""

import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import conftest  # noqa: E402  (the tests' Node: a daemon of its own)
from fake_internet import NAMES, RESOLVER, FakeInternet  # noqa: E402
import strata  # noqa: E402
from bench_table import pct, table  # noqa: E402

POOL = "10.216.0.0/24"
TABLE = "strata_10_216_0_0_24"
GATEWAY = "10.216.0.1"
PLAIN_NS = "strata-bench-plain"
PROBE = os.path.join(conftest.BUILD, "tests", "python", "net_probe")
ROUNDS = 25  # of 100 connects, alternating sandbox and baseline


def sh(*argv):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def plain_namespace():
    """A namespace with a veth and a route to the fake internet, no rules."""
    sh("ip", "netns", "add", PLAIN_NS)
    sh("ip", "link", "add", "sbplain0", "type", "veth", "peer", "name", "eth0", "netns", PLAIN_NS)
    sh("ip", "addr", "add", "10.217.0.1/30", "dev", "sbplain0")
    sh("ip", "link", "set", "sbplain0", "up")
    sh("ip", "-n", PLAIN_NS, "addr", "add", "10.217.0.2/30", "dev", "eth0")
    sh("ip", "-n", PLAIN_NS, "link", "set", "eth0", "up")
    sh("ip", "-n", PLAIN_NS, "link", "set", "lo", "up")
    sh("ip", "-n", PLAIN_NS, "route", "add", "default", "via", "10.217.0.1")


def remove_plain_namespace():
    subprocess.run(["ip", "link", "del", "sbplain0"], capture_output=True)
    subprocess.run(["ip", "netns", "del", PLAIN_NS], capture_output=True)


def sandbox_pid(node, sandbox_id):
    """A process of the sandbox (its agent), found in its cgroup."""
    for top, _, files in os.walk(f"/sys/fs/cgroup/pids/{node.cgroup}/{sandbox_id}"):
        if "cgroup.procs" in files:
            with open(os.path.join(top, "cgroup.procs")) as f:
                pids = f.read().split()
            if pids:
                return int(pids[0])
    raise RuntimeError(f"no process of sandbox {sandbox_id} in its cgroup")


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    net = FakeInternet(ttl=300).start()
    node = None
    try:
        plain_namespace()
        node = conftest.make_node(extra=["--net-pool", POOL, "--dns-upstream", RESOLVER])
        with strata.Client(url="unix://" + node.socket) as client:
            # 1. create -> exec true -> destroy.
            times = {"none": [], "allow": []}
            for i in range(cycles * 2):
                mode = "none" if i % 2 == 0 else "allow"
                t0 = time.perf_counter()
                sb = client.create(layers=["busybox:1"], network=mode, allow=["a.test"] if mode == "allow" else None)
                sb.exec(["true"])
                sb.destroy()
                times[mode].append((time.perf_counter() - t0) * 1000)
            none50, allow50 = statistics.median(times["none"]), statistics.median(times["allow"])
            print(f"scripts/bench net: {cycles} cycles of each, interleaved; TCP connects x {ROUNDS * 100}; "
                  "a 64 MiB download; 20000 DNS queries\n")
            rows = [["create -> exec true -> destroy, p50 / p90", f"{allow50:.1f} / {pct(times['allow'], 90):.1f} ms (allow)",
                     f"{none50:.1f} / {pct(times['none'], 90):.1f} ms (none)", f"+{allow50 - none50:.1f} ms"]]

            with client.create(layers=["busybox:1"], network="allow", allow=["a.test", "b.test"]) as sb:
                with open(PROBE, "rb") as f:
                    sb.write_file("/tmp/net_probe", f.read(), mode=0o755)
                assert sb.exec("nslookup a.test").exit_code == 0
                a = NAMES["a.test"]
                # 2-3. TCP connect and a download, in rounds that alternate with
                # the baselines (the fake internet's server is one Python
                # process: whoever runs right after a busy phase pays for it).
                # The sandbox's own namespace, entered from the node: the same
                # path (veth, rules, NAT) without the container's costs
                # (seccomp on every system call, cgroups).
                netns = f"/proc/{sandbox_pid(node, sb.id)}/ns/net"
                # Connects go to port 9, which accepts and closes (no HTTP
                # server thread per connection competing for the CPU); each
                # round's ratio is taken against the baseline measured right
                # after it, so the machine's drift cancels.
                ours_c, path_c, base_c, ours_d, base_d = [], [], [], [], []
                for _ in range(ROUNDS):
                    ours_c.append(float(sb.exec(["/tmp/net_probe", "connect", a, "9", "100"]).stdout.split()[0]))
                    path_c.append(float(sh("nsenter", "--net=" + netns, PROBE, "connect", a, "9", "100").split()[0]))
                    base_c.append(float(sh("ip", "netns", "exec", PLAIN_NS, PROBE, "connect", a, "9", "100").split()[0]))
                for _ in range(5):
                    out = sb.exec(["/tmp/net_probe", "get", a, "80", "/big"]).stdout.decode().split()
                    if out[0] == "error":
                        raise RuntimeError("download in the sandbox: " + " ".join(out))
                    ours_d.append(int(out[0]) / float(out[1]) / 1e6)
                    out = sh(PROBE, "get", a, "80", "/big").split()
                    base_d.append(int(out[0]) / float(out[1]) / 1e6)
                oc, pc, bc = statistics.median(ours_c), statistics.median(path_c), statistics.median(base_c)
                o_ratio = statistics.median(o / b for o, b in zip(ours_c, base_c))
                p_ratio = statistics.median(p / b for p, b in zip(path_c, base_c))
                rows.append([f"TCP connect, medians of {ROUNDS} p50s of 100 (ratio: median of the rounds')",
                             f"{oc:.1f} us, from the sandbox through the policy", f"{bc:.1f} us, plain namespace", f"{o_ratio:.2f}x"])
                rows.append(["  the same, the sandbox's namespace entered from the node", f"{pc:.1f} us (policy and NAT only)",
                             f"{bc:.1f} us, plain namespace", f"{p_ratio:.2f}x"])
                od, bd = statistics.median(ours_d), statistics.median(base_d)
                rows.append(["64 MiB download, median of 5", f"{od:.0f} MB/s in a sandbox", f"{bd:.0f} MB/s on the node",
                             f"{od / bd:.2f}"])
                # 4. DNS.
                ours = sb.exec(["/tmp/net_probe", "dns", GATEWAY, "a.test", "20000"]).stdout.decode().strip()
                base = sh(PROBE, "dns", RESOLVER, "a.test", "20000").strip()
                rows.append(["DNS answers/s (32 in flight)", f"{ours} through the proxy (one name: admitted, then answered)",
                             f"{base} from dnsmasq directly", f"{float(ours) / float(base):.2f}"])
            table(["", "ours", "baseline", "ratio"], rows)
    finally:
        if node:
            node.cleanup()
        for argv in (["nft", "delete", "table", "inet", TABLE], ["nft", "delete", "table", "ip", TABLE + "_nat"],
                     ["ip", "addr", "del", "10.216.0.1/32", "dev", "lo"], ["rmdir", "/run/strata/netns/" + TABLE]):
            subprocess.run(argv, capture_output=True)
        remove_plain_namespace()
        net.stop()


if __name__ == "__main__":
    main()
