"""A real etcd cluster for the system tests: Debian's etcd-server 3.4
(/usr/bin/etcd), three members on loopback only, their data on a tmpfs the
helper mounts itself. Everything it made (processes, the mount, the temp
directory) is removed by stop(), also when a test fails or start() failed
halfway.

    from etcd_cluster import EtcdCluster, etcd_cluster, skip_reason
    etcd = pytest.fixture(etcd_cluster)            # or pytest.fixture(scope="module")(etcd_cluster)

    def test_x(etcd):
        etcd.put("/a", "1"); assert etcd.get("/a") == "1"
        i = etcd.leader(); etcd.kill(i); ...; etcd.restart(i)

or `with EtcdCluster() as c: ...`. Keys and values are read and written
through the v3 JSON gateway (/v3/kv/..., base64 in the JSON); etcdctl()
runs /usr/bin/etcdctl (ETCDCTL_API=3) against the cluster.

The tmpfs is 256 MiB per member, not 256 MiB in all: etcd 3.4 preallocates
its WAL in 64 MB segments (the current one and the next, so 128 MB a member,
really allocated on a tmpfs) and three members do not fit in 256 MiB.
"""

import atexit
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"

# Signals after which kill() does not wait for the member to exit.
_NON_FATAL = {signal.SIGSTOP, signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH,
              signal.SIGURG, signal.SIGCHLD}
# No proxy from the environment for loopback requests.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_live = set()  # started and not yet stopped, for the atexit handler


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (mounts a tmpfs for etcd's data)"
    if not os.access(ETCD, os.X_OK):
        return f"no etcd at {ETCD} (apt-get install etcd-server)"
    return None


def _b64(s):
    return base64.b64encode(s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)).decode("ascii")


def _unb64(s):
    return base64.b64decode(s or "").decode("utf-8", "surrogateescape")


def _prefix_end(prefix):
    """etcd's range end for "every key with this prefix" (clientv3.GetPrefixRangeEnd)."""
    b = bytearray(prefix.encode("utf-8", "surrogateescape") if isinstance(prefix, str) else prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[:i + 1])
    return b"\0"  # all 0xff (or empty): to the end of the keyspace


def _free_ports(host, n):
    """n distinct free TCP ports on host: all bound at once, then released."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdError(RuntimeError):
    pass


class EtcdCluster:
    def __init__(self, members=3, host="127.0.0.1", snapshot_count=1000, compaction_retention=1000,
                 tmpfs_mb=None, quota_mb=64):
        self.members = members
        self.host = host
        self.snapshot_count = snapshot_count
        self.compaction_retention = compaction_retention  # revisions (--auto-compaction-mode revision)
        self.tmpfs_mb = tmpfs_mb or 256 * members
        self.quota_mb = quota_mb  # --quota-backend-bytes: the NOSPACE alarm well before the tmpfs is full
        self.dir = None
        self.mounted = False
        self.token = None
        self.endpoints = []  # client URLs
        self.peers = []      # peer URLs
        self._procs = [None] * members  # None: not started or killed on purpose
        self._next = 0  # round robin over the members for the kv helpers

    # --- life cycle

    def start(self):
        if self.dir:
            raise RuntimeError("the etcd cluster is already started")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        _live.add(self)
        self.dir = tempfile.mkdtemp(prefix="strata-etcd-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.tmpfs_mb}m,mode=0700", "tmpfs", self.dir],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mount -t tmpfs on {self.dir} failed: {r.stderr.strip()}")
        self.mounted = True
        for attempt in range(2):
            self.token = "strata-" + secrets.token_hex(8)
            ports = _free_ports(self.host, 2 * self.members)
            self.endpoints = [f"http://{self.host}:{p}" for p in ports[:self.members]]
            self.peers = [f"http://{self.host}:{p}" for p in ports[self.members:]]
            for i in range(self.members):
                self._spawn(i, "new")
            try:
                self.wait_healthy(20)
                return
            except EtcdError as e:
                if attempt == 0 and "address already in use" in str(e):
                    # Someone took a port between our probe and etcd's bind: again with new ports and empty data.
                    self._kill_all()
                    for i in range(self.members):
                        shutil.rmtree(self._data(i), ignore_errors=True)
                        try:
                            os.unlink(self._log(i))
                        except FileNotFoundError:
                            pass
                    continue
                raise

    def stop(self):
        """Kills every member (SIGTERM, SIGKILL after 5 s), unmounts the tmpfs and
        removes the directory. Idempotent; fine after a start() that failed."""
        try:
            self._kill_all()
        finally:
            try:
                self._umount()
            finally:
                if self.dir:
                    shutil.rmtree(self.dir, ignore_errors=True)
                    if os.path.exists(self.dir):
                        print(f"etcd_cluster: directory left: {self.dir}", file=sys.stderr)
                    self.dir = None
                _live.discard(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def kill(self, i, sig=signal.SIGKILL):
        """Sends sig to member i. Unless it is a signal like SIGSTOP or SIGCONT,
        waits for the member to exit (SIGKILL after 5 s); restart(i) starts it again."""
        p = self._procs[i]
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            if sig in _NON_FATAL:
                return
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._procs[i] = None

    def restart(self, i, timeout=20):
        """Starts member i again on its data directory and ports (killing it
        first if it still runs) and waits for its /health."""
        self.kill(i)
        with open(self._log(i), "a") as f:
            f.write(f"----- restart at {time.strftime('%H:%M:%S')} -----\n")
        self._spawn(i, "existing")
        self._wait([i], timeout)

    def wait_healthy(self, timeout=20):
        """Waits until every running member answers /health with {"health":"true"}
        (members killed on purpose are left out); raises with the logs otherwise."""
        self._wait([i for i in range(self.members) if self._procs[i] is not None], timeout)

    def running(self):
        return [i for i in range(self.members) if self._procs[i] is not None and self._procs[i].poll() is None]

    def url(self):
        return ",".join(self.endpoints)

    def pid(self, i):
        p = self._procs[i]
        return p.pid if p else None

    def logs(self, tail=6000):
        """The end of every member's log, for a failure message."""
        out = []
        for i in range(self.members):
            try:
                with open(self._log(i), "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - tail))
                    text = f.read().decode("utf-8", "replace")
            except (OSError, TypeError):
                text = "(no log)"
            out.append(f"=== member {i} ({self.endpoints[i] if i < len(self.endpoints) else '?'}) ===\n{text}")
        return "\n".join(out)

    # --- cluster state

    def status(self, i, timeout=2):
        """POST /v3/maintenance/status on member i (ids are strings, as in the gateway's JSON)."""
        return self._call(self.endpoints[i], "/v3/maintenance/status", {}, timeout)

    def leader(self, timeout=10):
        """The index of the leader: a member that says it leads, with a majority
        of the members agreeing. Waits up to timeout seconds for one."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            seen = {}
            for i in self.running():
                try:
                    seen[i] = self.status(i, timeout=1)
                except Exception as e:
                    last = e
            ids = {s["header"]["member_id"]: i for i, s in seen.items()}
            for i, s in seen.items():
                lead = s.get("leader")
                if lead and lead in ids and sum(1 for t in seen.values() if t.get("leader") == lead) > self.members // 2:
                    return ids[lead]
            if time.monotonic() >= deadline:
                raise EtcdError(f"no etcd leader in {timeout} s (status: {seen}, last error: {last})\n" + self.logs())
            time.sleep(0.05)

    def followers(self):
        lead = self.leader()
        return [i for i in self.running() if i != lead]

    # --- keys, through the v3 JSON gateway; member=None: any running member, retried until timeout

    def put(self, key, value, member=None, timeout=10):
        """Returns the revision of the put."""
        r = self._kv("/v3/kv/put", {"key": _b64(key), "value": _b64(value)}, member, timeout)
        return int(r["header"]["revision"])

    def get(self, key, member=None, serializable=False, timeout=10):
        r = self._kv("/v3/kv/range", {"key": _b64(key), "serializable": serializable}, member, timeout)
        kvs = r.get("kvs") or []
        return _unb64(kvs[0].get("value")) if kvs else None

    def prefix(self, prefix, member=None, serializable=False, timeout=10):
        """Every key under the prefix ("" for all) and its value."""
        body = {"key": _b64(prefix) if prefix else _b64(b"\0"), "range_end": _b64(_prefix_end(prefix)),
                "serializable": serializable}
        r = self._kv("/v3/kv/range", body, member, timeout)
        return {_unb64(kv["key"]): _unb64(kv.get("value")) for kv in r.get("kvs") or []}

    def delete(self, key, prefix=False, member=None, timeout=10):
        """Returns how many keys were deleted."""
        body = {"key": _b64(key) if key or not prefix else _b64(b"\0")}
        if prefix:
            body["range_end"] = _b64(_prefix_end(key))
        return int(self._kv("/v3/kv/deleterange", body, member, timeout).get("deleted", 0))

    def etcdctl(self, *args, check=True, timeout=30):
        """Runs etcdctl (API 3) against every member; the CompletedProcess, text."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
        env["ETCDCTL_API"] = "3"
        r = subprocess.run([ETCDCTL, "--endpoints", self.url(), *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise EtcdError(f"etcdctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    # --- internals

    def _data(self, i):
        return os.path.join(self.dir, f"m{i}")

    def _log(self, i):
        return os.path.join(self.dir, f"m{i}.log")

    def _spawn(self, i, state):
        cluster = ",".join(f"m{j}={self.peers[j]}" for j in range(self.members))
        argv = [ETCD, "--name", f"m{i}", "--data-dir", self._data(i),
                "--listen-client-urls", self.endpoints[i], "--advertise-client-urls", self.endpoints[i],
                "--listen-peer-urls", self.peers[i], "--initial-advertise-peer-urls", self.peers[i],
                "--initial-cluster", cluster, "--initial-cluster-state", state, "--initial-cluster-token", self.token,
                "--heartbeat-interval", "100", "--election-timeout", "1000", "--pre-vote=true",
                "--snapshot-count", str(self.snapshot_count), "--max-snapshots", "2", "--max-wals", "2",
                "--auto-compaction-mode", "revision", "--auto-compaction-retention", str(self.compaction_retention),
                "--quota-backend-bytes", str(self.quota_mb << 20),
                "--logger", "zap", "--log-outputs", "stderr"]
        # etcd takes ETCD_* variables for flags (and refuses a flag given twice); no proxies either.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ETCD_", "ETCDCTL_")) and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        with open(self._log(i), "a") as log:
            self._procs[i] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              cwd=self.dir, start_new_session=True)

    def _kill_all(self):
        """SIGTERM, SIGKILL what is left after 5 s. The followers first: a leader
        stopped with them tries to hand its leadership to one and takes 7 s."""
        procs = [p for p in self._procs if p is not None]
        live = [p for p in procs if p.poll() is None]
        lead = self._leader_now() if len(live) > 1 else None
        deadline = time.monotonic() + 5
        for group in ([p for p in procs if p is not lead], [lead] if lead else []):
            for p in group:
                if p.poll() is None:
                    for sig in (signal.SIGTERM, signal.SIGCONT):  # (SIGCONT: one stopped with SIGSTOP)
                        try:
                            os.killpg(p.pid, sig)
                        except ProcessLookupError:
                            pass
            for p in group:
                try:
                    p.wait(max(1.0 if p is lead else 0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()
        self._procs = [None] * self.members

    def _leader_now(self):
        """The process of a member that says it leads, if one answers at once; else None."""
        for i in self.running():
            try:
                s = self.status(i, timeout=0.5)
                if s.get("leader") and s["header"]["member_id"] == s["leader"]:
                    return self._procs[i]
            except Exception:
                pass
        return None

    def _umount(self):
        if not self.mounted:
            return
        err = ""
        for _ in range(20):
            r = subprocess.run(["umount", self.dir], capture_output=True, text=True)
            if r.returncode == 0 or not os.path.ismount(self.dir):
                self.mounted = False
                return
            err = r.stderr.strip()
            time.sleep(0.1)
        r = subprocess.run(["umount", "-l", self.dir], capture_output=True, text=True)
        if r.returncode != 0 and os.path.ismount(self.dir):
            print(f"etcd_cluster: could not unmount {self.dir}: {err}; {r.stderr.strip()}", file=sys.stderr)
            return
        self.mounted = False

    def _wait(self, members, timeout):
        deadline = time.monotonic() + timeout
        pending = set(members)
        last = {}
        while True:
            for i in sorted(pending):
                p = self._procs[i]
                if p is None or p.poll() is not None:
                    code = None if p is None else p.returncode
                    raise EtcdError(f"etcd member {i} exited ({code}) before it was healthy\n" + self.logs())
                try:
                    with _HTTP.open(self.endpoints[i] + "/health", timeout=1) as r:
                        body = json.loads(r.read())
                    if body.get("health") == "true":
                        pending.discard(i)
                    else:
                        last[i] = body
                except Exception as e:
                    last[i] = e
            if not pending:
                return
            if time.monotonic() >= deadline:
                detail = {i: str(last.get(i)) for i in sorted(pending)}
                raise EtcdError(f"etcd members {sorted(pending)} not healthy in {timeout} s: {detail}\n" + self.logs())
            time.sleep(0.1)

    def _call(self, endpoint, path, body, timeout):
        req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with _HTTP.open(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            raise EtcdError(f"{endpoint}{path}: HTTP {e.code}: {text}") from None

    def _kv(self, path, body, member, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while True:
            if member is not None:
                order = [member]
            else:
                up = self.running()
                self._next += 1
                order = up[self._next % len(up):] + up[:self._next % len(up)] if up else []
            for i in order:
                left = deadline - time.monotonic()
                try:
                    return self._call(self.endpoints[i], path, body, max(0.2, min(3.0, left)))
                except (OSError, EtcdError, ValueError) as e:  # (URLError, timeouts and resets are OSErrors)
                    last = f"member {i}: {e}"
                if time.monotonic() >= deadline:
                    break
            if time.monotonic() >= deadline:
                raise EtcdError(f"{path} failed for {timeout} s: {last or 'no member running'}")
            time.sleep(0.05)


def etcd_cluster():
    """A started cluster of three, stopped at the end; register with
    pytest.fixture(etcd_cluster) (any scope). Skips without root or etcd."""
    import pytest
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    c = EtcdCluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


@atexit.register
def _stop_all():
    for c in list(_live):
        try:
            c.stop()
        except Exception:
            pass
