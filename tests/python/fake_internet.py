"""A fake internet for the sandbox-network tests and the net benchmark,
inside a network namespace of its own: hosts on 198.18.0.0/15 addresses
(and a private and a metadata address, to catch a rule that lets them
through), each with HTTP on ports 80 and 8080, a TCP port 9 that accepts
and closes, and a UDP echo on 9999, and dnsmasq resolving the test names. The node routes those addresses into the
namespace, so nothing a test sends ever leaves the machine.

    with FakeInternet() as net: ...   # or start() / stop()
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

NAMES = {
    "a.test": "198.18.1.1",
    "b.test": "198.18.1.2",
    "one.w.test": "198.18.1.3",
    "w.test": "198.18.1.4",
}
RESOLVER = "198.18.0.53"
# Names that resolve where a sandbox may never go (DNS rebinding).
REBIND = {"evil.test": "10.99.1.1", "meta.test": "169.254.169.254"}
PRIVATE_HOST = "10.99.1.1"        # a private address: always refused
ALLOWED_PRIVATE_HOST = "10.99.2.1"  # in the range the tests' daemon allows (--allow-private 10.99.2.0/24)
METADATA_HOST = "169.254.169.254"  # the cloud metadata address: always refused
ROUTES = ["198.18.0.0/15", "10.99.0.0/16", "169.254.169.254/32"]

SERVER = r'''
import socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, *a): pass
    def do_GET(self):
        host = self.connection.getsockname()[0]
        if self.path.startswith("/slow"):
            # One byte every 50 ms for 60 s.
            self.send_response(200); self.send_header("Content-Length", "1200"); self.end_headers()
            for _ in range(1200):
                self.wfile.write(b"."); self.wfile.flush(); time.sleep(0.05)
            return
        if self.path.startswith("/big"):
            n = int(self.path.split("=", 1)[1]) if "=" in self.path else 64 << 20
            self.send_response(200); self.send_header("Content-Length", str(n)); self.end_headers()
            block = b"x" * 65536
            while n > 0:
                k = min(n, len(block)); self.wfile.write(block[:k]); n -= k
            return
        body = ("hello from %s\n" % host).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)

class S(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

def udp_echo(addr):
    # One socket per address: an answer must come from the address asked.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 9999))
    while True:
        data, peer = s.recvfrom(65536)
        s.sendto(data, peer)

def accept_close(port):
    # Connects and nothing else (the net benchmark's connect row): no
    # thread per connection competing with the connects measured.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4096)
    while True:
        s.accept()[0].close()

for port in (80, 8080):
    threading.Thread(target=S(("0.0.0.0", port), H).serve_forever, daemon=True).start()
threading.Thread(target=accept_close, args=(9,), daemon=True).start()
for addr in sys.argv[1:]:
    threading.Thread(target=udp_echo, args=(addr,), daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(3600)
'''


def sh(*argv, check=True):
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


class FakeInternet:
    def __init__(self, ttl=1, tag=None):
        tag = tag or str(os.getpid() % 100000)
        self.ns = "strata-fi-" + tag
        self.veth = "fi" + tag
        self.ttl = ttl
        self.procs = []
        self.dir = tempfile.mkdtemp(prefix="strata-fi-")

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "addr", "add", "198.18.0.1/30", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        inside = ["ip", "-n", self.ns]
        sh(*inside, "addr", "add", "198.18.0.2/30", "dev", "eth0")
        sh(*inside, "link", "set", "eth0", "up")
        sh(*inside, "link", "set", "lo", "up")
        for a in list(NAMES.values()) + [RESOLVER, PRIVATE_HOST, ALLOWED_PRIVATE_HOST, METADATA_HOST]:
            sh(*inside, "addr", "add", a + "/32", "dev", "lo")
        sh(*inside, "route", "add", "default", "via", "198.18.0.1")
        for r in ROUTES:
            sh("ip", "route", "add", r, "via", "198.18.0.2")
        exec_ns = ["ip", "netns", "exec", self.ns]
        dnsmasq = [*exec_ns, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces",
                   "--listen-address=" + RESOLVER, "--pid-file=", f"--local-ttl={self.ttl}", "--log-facility=-"]
        dnsmasq += [f"--address=/{name}/{addr}" for name, addr in list(NAMES.items()) + list(REBIND.items())]
        self.procs.append(subprocess.Popen(dnsmasq, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "dnsmasq.log"), "w"),
                                           start_new_session=True))
        script = os.path.join(self.dir, "server.py")
        with open(script, "w") as f:
            f.write(SERVER)
        server = subprocess.Popen([*exec_ns, "/usr/bin/python3", script, *NAMES.values(), PRIVATE_HOST, METADATA_HOST], stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(self.dir, "server.log"), "w"), start_new_session=True, text=True)
        self.procs.append(server)
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the fake internet's servers did not start: " + open(os.path.join(self.dir, "server.log")).read())
        for _ in range(200):  # dnsmasq bound?
            if RESOLVER + ":53" in sh(*exec_ns, "ss", "-lnu", check=False).stdout:
                return
            time.sleep(0.02)
        raise RuntimeError("dnsmasq did not start: " + open(os.path.join(self.dir, "dnsmasq.log")).read())

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        self.procs = []
        for r in ROUTES:
            sh("ip", "route", "del", r, check=False)
        sh("ip", "link", "del", self.veth, check=False)
        sh("ip", "netns", "del", self.ns, check=False)
        subprocess.run(["rm", "-rf", self.dir])

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
    with FakeInternet() as net:
        print("fake internet in", net.ns, file=sys.stderr)
        signal.pause()
