"""A real launcher daemon for the SDK's tests: its own store with a busybox
layer, lazyfs daemon, run directory, cgroup parent and uppers directory,
listening on its unix socket and on loopback TLS with tenant tokens.
Everything it made is removed at the end, also when a test fails."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

BUILD = os.environ.get("STRATA_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
LAUNCHER = os.path.join(BUILD, "launcher", "launcher")
LAYERCTL = os.path.join(BUILD, "layerctl", "layerctl")
UPPERS = "/var/lib/strata/uppers"
CONTROLLERS = ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb", "memory", "pids", "systemd", "unified"]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def _skip_reason():
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.exists(LAUNCHER):
        return f"no launcher at {LAUNCHER} (build first)"
    fs = subprocess.run(["stat", "-f", "-c", "%T", UPPERS], capture_output=True, text=True)
    if fs.returncode != 0 or fs.stdout.strip() != "btrfs":
        return "run `launcher doctor --fix` first (scripts/setup does): the uppers are not btrfs"
    return None


class Node:
    """The daemon under test; restart() and kill() for the crash tests."""

    def __init__(self, root):
        self.root = root
        self.socket = os.path.join(root, "launcher.sock")
        self.log = os.path.join(root, "daemon.log")
        self.tokens = os.path.join(root, "tokens")
        self.cert = os.path.join(root, "cert.pem")
        self.key = os.path.join(root, "key.pem")
        self.store = "file://" + os.path.join(root, "store")
        self.cgroup = "strata-pytest-" + os.path.basename(root)
        self.uppers = os.path.join(UPPERS, ".pytest-" + os.path.basename(root))
        os.makedirs(self.uppers, mode=0o700)
        self.env = dict(os.environ, STRATA_STORE=self.store, STRATA_LAZYFS_SOCKET=os.path.join(root, "lazyfs.sock"),
                        STRATA_CACHE=os.path.join(root, "cache"), STRATA_RUN_DIR=os.path.join(root, "run"),
                        STRATA_CGROUP_PARENT=self.cgroup, STRATA_UPPERS=self.uppers)
        self.proc = None
        self.https = None
        self.extra = []  # more `launcher serve` flags

    def token(self, name, *limits):
        out = subprocess.run([LAUNCHER, "token", "new", name, "--tokens", self.tokens, *limits], check=True,
                             capture_output=True, text=True).stdout
        return out.strip()

    def start(self):
        open(self.log, "w").close()
        self.proc = subprocess.Popen(
            [LAUNCHER, "serve", "--socket", self.socket, "--state", os.path.join(self.root, "state"), "--tokens",
             self.tokens, "--listen", "127.0.0.1:0", "--tls-cert", self.cert, "--tls-key", self.key, "--store", self.store,
             *self.extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"), start_new_session=True)
        for _ in range(1000):
            text = open(self.log).read()
            m = re.search(r"serving on (https://127\.0\.0\.1:\d+)", text)
            if m:
                self.https = m.group(1)
                return
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited: " + text)
            time.sleep(0.01)
        raise RuntimeError("the daemon did not start: " + open(self.log).read())

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait()
        self.proc = None

    def restart(self, sig=signal.SIGKILL):
        """Kills the daemon and starts it again on the same state and port."""
        port = self.https.rsplit(":", 1)[1]
        self.kill(sig)
        open(self.log, "w").close()
        self.proc = subprocess.Popen(
            [LAUNCHER, "serve", "--socket", self.socket, "--state", os.path.join(self.root, "state"), "--tokens",
             self.tokens, "--listen", f"127.0.0.1:{port}", "--tls-cert", self.cert, "--tls-key", self.key, "--store",
             self.store, *self.extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"), start_new_session=True)
        for _ in range(1000):
            if "serving on https" in open(self.log).read():
                return
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited: " + open(self.log).read())
            time.sleep(0.01)

    def sandboxes(self):
        """The node's own count (as root, on the unix socket)."""
        import json
        out = subprocess.run([LAUNCHER, "ls", "--json", "--socket", self.socket], capture_output=True, text=True,
                             env=self.env, check=True).stdout
        return json.loads(out)

    def cleanup(self):
        try:
            for s in self.sandboxes():
                subprocess.run([LAUNCHER, "destroy", s["id"], "--socket", self.socket], env=self.env, capture_output=True)
        except Exception:
            pass
        self.kill(signal.SIGTERM)
        # The lazyfs daemon the launcher started for this node.
        subprocess.run(["pkill", "-TERM", "-f", "lazyfs daemon --socket " + self.env["STRATA_LAZYFS_SOCKET"]])
        for _ in range(500):
            if subprocess.run(["pgrep", "-f", "lazyfs daemon --socket " + self.env["STRATA_LAZYFS_SOCKET"]],
                              capture_output=True).returncode != 0:
                break
            time.sleep(0.01)
        for d in [f"/sys/fs/cgroup/{c}/{self.cgroup}" for c in CONTROLLERS] + [f"/sys/fs/cgroup/cpu/{self.cgroup}-node"]:
            try:
                os.rmdir(d)  # (the last: the daemon's own, launcher/node/node_cgroup.h)
            except OSError:
                pass
        try:
            # The upper disk templates of microVMs (vmm/guest_files.h).
            shutil.rmtree(os.path.join(self.uppers, ".vm-templates"), ignore_errors=True)
            if os.path.isdir(os.path.join(self.uppers, ".snapshots")):
                os.rmdir(os.path.join(self.uppers, ".snapshots"))  # made by the first snapshot
            os.rmdir(self.uppers)
        except OSError as e:
            print(f"uppers directory left: {self.uppers}: {e}", file=sys.stderr)
        shutil.rmtree(self.root, ignore_errors=True)


def make_node(extra=()):
    """A node of its own in a new directory: a busybox layer, a certificate,
    two tenants ("trainer", "other"), the daemon started. Call cleanup()."""
    root = tempfile.mkdtemp(prefix="strata-pytest-")
    os.chmod(root, 0o711)
    n = Node(root)
    n.extra = list(extra)
    try:
        busybox = os.path.join(root, "busybox")
        for d in ("bin", "proc", "sys", "dev", "tmp", "etc", "root", "mnt"):
            os.makedirs(os.path.join(busybox, d))
        shutil.copy("/bin/busybox", os.path.join(busybox, "bin", "busybox"))
        applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        for a in applets:
            if a != "busybox":
                os.symlink("busybox", os.path.join(busybox, "bin", a))
        with open(os.path.join(busybox, "etc", "passwd"), "w") as f:
            f.write("root:x:0:0:root:/root:/bin/sh\n")
        os.chmod(os.path.join(busybox, "tmp"), 0o1777)
        subprocess.run([LAYERCTL, "build", busybox, "-o", os.path.join(root, "layer"), "--name", "busybox", "--tag",
                        "busybox:1"], env=n.env, check=True, capture_output=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", n.key, "-out", n.cert, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                        "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        n.tenant = n.token("trainer", "--publish", "trainer-*")
        n.other = n.token("other")
        n.start()
    except BaseException:
        n.cleanup()
        raise
    return n


@pytest.fixture(scope="session")
def node():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    n = make_node()
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture(params=["tls", "unix"])
def target(request, node):
    """How a client reaches the node: TLS with a tenant's token, or the unix socket as root."""
    if request.param == "tls":
        return {"url": node.https, "token": node.tenant, "verify": node.cert}
    return {"url": "unix://" + node.socket, "token": None, "verify": True}
