"""A cluster on this one machine: a three-member etcd on loopback ports, four
node daemons (each with its own state, run directory, uppers, lazyfs,
cache, cgroup parent and loopback address; one of them in the overflow
pool) and two gateways, all real processes. The SDK talks to the gateways
as a training loop would. Everything is stopped and removed at the end,
also when a test fails."""

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import LAUNCHER, LAYERCTL, UPPERS, CONTROLLERS, _skip_reason  # noqa: E402
from etcd_cluster import EtcdCluster, skip_reason as etcd_skip_reason  # noqa: E402

import strata  # noqa: E402  (conftest put python/ on the path)

MAIN = ["n1", "n2", "n3"]
OVERFLOW = "n4"
SLOTS = 100      # --max-sandboxes of every node
LEASE = 3        # seconds
THRESHOLD = 0.8  # the gateways' --overflow-threshold (their default)


def run(*argv, env=None, check=True):
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, check=check)


class Daemon:
    """A launcher process of the cluster (a node or a gateway), in a session
    of its own, its stderr in `self.log`."""

    proc = None

    def launch(self, argv, marker, env=None):
        """Starts it and waits until its log says `marker` (20 s)."""
        open(self.log, "w").close()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"),
                                     start_new_session=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            if marker in open(self.log).read():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: " + open(self.log).read())
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not start: " + open(self.log).read())

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait()
        self.proc = None


class ClusterNode(Daemon):
    """One node daemon: `launcher serve --node NAME --cluster ...` on its own
    loopback address, with every per-node setting of its own."""

    def __init__(self, root, name, address, cluster, labels, store, tokens, cert, key):
        self.name, self.address, self.cluster, self.labels = name, address, cluster, labels
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.socket = os.path.join(self.dir, "launcher.sock")
        self.log = os.path.join(self.dir, "daemon.log")
        self.cgroup = f"strata-pytest-{os.path.basename(root)}-{name}"
        self.uppers = os.path.join(UPPERS, f".pytest-{os.path.basename(root)}-{name}")
        os.makedirs(self.uppers, mode=0o700)
        self.store, self.tokens, self.cert, self.key = store, tokens, cert, key
        self.env = dict(os.environ, STRATA_STORE=store, STRATA_LAZYFS_SOCKET=os.path.join(self.dir, "lazyfs.sock"),
                        STRATA_CACHE=os.path.join(self.dir, "cache"), STRATA_RUN_DIR=os.path.join(self.dir, "run"),
                        STRATA_CGROUP_PARENT=self.cgroup, STRATA_UPPERS=self.uppers)
        self.proc = None

    def argv(self):
        argv = [LAUNCHER, "serve", "--socket", self.socket, "--state", os.path.join(self.dir, "state"), "--tokens",
                self.tokens, "--listen", self.address, "--tls-cert", self.cert, "--tls-key", self.key, "--store",
                self.store, "--node", self.name, "--cluster", self.cluster, "--lease", str(LEASE),
                "--max-sandboxes", str(SLOTS)]
        for k, v in self.labels.items():
            argv += ["--label", f"{k}={v}"]
        return argv

    def start(self):
        self.launch(self.argv(), "serving on https", self.env)

    def sandboxes(self):
        """What the node itself holds (as root on its unix socket)."""
        out = run(LAUNCHER, "ls", "--json", "--socket", self.socket, env=self.env).stdout
        return json.loads(out)

    def cleanup(self):
        if not self.proc or self.proc.poll() is not None:
            try:  # (a node a failed test left dead: started again, it re-adopts what it holds, to destroy it)
                self.start()
            except Exception as e:
                print(f"node {self.name}: {e}", file=sys.stderr)
        if self.proc and self.proc.poll() is None:
            try:
                for s in self.sandboxes():
                    run(LAUNCHER, "destroy", s["id"], "--socket", self.socket, env=self.env, check=False)
            except Exception as e:  # (the cleanup goes on)
                print(f"node {self.name}: {e}", file=sys.stderr)
        self.kill(signal.SIGTERM)
        lazyfs = "lazyfs daemon --socket " + self.env["STRATA_LAZYFS_SOCKET"]
        subprocess.run(["pkill", "-TERM", "-f", lazyfs])
        for _ in range(500):
            if subprocess.run(["pgrep", "-f", lazyfs], capture_output=True).returncode != 0:
                break
            time.sleep(0.01)
        for d in [f"/sys/fs/cgroup/{c}/{self.cgroup}" for c in CONTROLLERS] + [f"/sys/fs/cgroup/cpu/{self.cgroup}-node"]:
            try:
                os.rmdir(d)
            except OSError:
                pass
        try:
            if os.path.isdir(os.path.join(self.uppers, ".snapshots")):
                os.rmdir(os.path.join(self.uppers, ".snapshots"))
            os.rmdir(self.uppers)
        except OSError as e:
            print(f"uppers directory left: {self.uppers}: {e}", file=sys.stderr)


class GatewayProc(Daemon):
    def __init__(self, root, name, address, cluster, tokens, node_token, cert, key):
        self.name, self.address = name, address
        self.log = os.path.join(root, f"{name}.log")
        self.argv = [LAUNCHER, "gateway", "--cluster", cluster, "--listen", address, "--tls-cert", cert, "--tls-key", key,
                     "--tokens", tokens, "--node-token", node_token, "--node-ca", cert,
                     "--overflow", "pool=cloud", "--overflow-threshold", str(THRESHOLD)]
        self.proc = None
        self.url = f"https://{address}"

    def start(self):
        self.launch(self.argv, "gateway serving on")


def free_port(host):
    import socket
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="strata-cl-")
        os.chmod(self.root, 0o711)
        self.etcd = None
        self.nodes = {}
        self.gateways = []

    def start(self):
        self.etcd = EtcdCluster(members=3)
        self.etcd.start()
        # One store and one busybox layer for every node.
        store = "file://" + os.path.join(self.root, "store")
        busybox = os.path.join(self.root, "busybox")
        for d in ("bin", "proc", "sys", "dev", "tmp", "etc", "root"):
            os.makedirs(os.path.join(busybox, d))
        shutil.copy("/bin/busybox", os.path.join(busybox, "bin", "busybox"))
        for a in run("/bin/busybox", "--list").stdout.split():
            if a != "busybox":
                os.symlink("busybox", os.path.join(busybox, "bin", a))
        os.chmod(os.path.join(busybox, "tmp"), 0o1777)
        run(LAYERCTL, "build", busybox, "-o", os.path.join(self.root, "layer"), "--name", "busybox", "--tag", "busybox:1",
            env=dict(os.environ, STRATA_STORE=store))
        # One certificate for every loopback address the cluster uses.
        self.cert, key = os.path.join(self.root, "cert.pem"), os.path.join(self.root, "key.pem")
        sans = ",".join(f"IP:127.0.0.{i}" for i in range(1, 12))
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
            "-out", self.cert, "-days", "2", "-subj", "/CN=strata-cluster-test", "-addext", f"subjectAltName={sans}")
        # One tokens file for nodes and gateways: a tenant, and the gateways' credential.
        tokens = os.path.join(self.root, "tokens")
        self.tenant = run(LAUNCHER, "token", "new", "trainer", "--tokens", tokens, "--publish", "trainer-*").stdout.strip()
        node_token = os.path.join(self.root, "gateway-credential")
        with open(node_token, "w") as f:
            f.write(run(LAUNCHER, "token", "new", "gw", "--tokens", tokens, "--gateway").stdout)
        os.chmod(node_token, 0o600)
        self.tokens = tokens
        for i, name in enumerate(MAIN + [OVERFLOW]):
            address = f"127.0.0.{2 + i}"
            labels = {"pool": "cloud" if name == OVERFLOW else "main"}
            n = ClusterNode(self.root, name, f"{address}:{free_port(address)}", self.etcd.url(), labels, store, tokens,
                            self.cert, key)
            self.nodes[name] = n
            n.start()
        for i in range(2):
            address = f"127.0.0.{8 + i}"
            g = GatewayProc(self.root, f"g{i + 1}", f"{address}:{free_port(address)}", self.etcd.url(), tokens,
                            node_token, self.cert, key)
            self.gateways.append(g)
            g.start()
        self.wait_live(set(self.nodes))

    def client(self, *gateways, **kw):
        urls = [g.url for g in (gateways or self.gateways)]
        return strata.Client(urls, token=self.tenant, verify=self.cert, **kw)

    def live(self):
        return {k[len("/strata/live/"):] for k in self.etcd.prefix("/strata/live/")}

    def wait_live(self, want, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.live() == want:
                # (and the gateways' view, polled every 0.5 s)
                time.sleep(1.2)
                return
            time.sleep(0.1)
        raise AssertionError(f"live nodes {sorted(self.live())}, wanted {sorted(want)}")

    def wait_reported_empty(self, timeout=20):
        """Until every node's last report (what the gateways place by) says
        it holds no sandbox: a test that follows a burst of destroys would
        otherwise place by reports from before them."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            loads = {k: json.loads(v)["load"]["sandboxes"] for k, v in self.etcd.prefix("/strata/live/").items()}
            if len(loads) == len(self.nodes) and not any(loads.values()):
                time.sleep(1.2)  # (the gateways' next look)
                return
            time.sleep(0.1)
        raise AssertionError(f"node reports still count sandboxes: {loads}")

    def counts(self):
        return {name: len(n.sandboxes()) for name, n in self.nodes.items()}

    def stop(self):
        for g in self.gateways:
            g.kill(signal.SIGTERM)
        for n in self.nodes.values():
            try:
                n.cleanup()
            except Exception as e:
                print(f"cleanup {n.name}: {e}", file=sys.stderr)
        if self.etcd:
            self.etcd.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    reason = _skip_reason() or etcd_skip_reason()
    if reason:
        pytest.skip(reason)
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


def node_of(sandbox_id):
    m = re.fullmatch(r"sb-(.+)-[0-9a-f]{12}", sandbox_id)
    assert m, sandbox_id
    return m.group(1)


def destroy_all(client, boxes):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: b.destroy(), boxes))


def test_creations_spread_by_load_and_calls_reach_their_node(cluster):
    # Half through each gateway: two placers that share nothing but what
    # the nodes report.
    with cluster.client() as c, cluster.client(cluster.gateways[0]) as g1, cluster.client(cluster.gateways[1]) as g2:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            boxes = list(pool.map(lambda i: (g1, g2)[i % 2].create(["busybox:1"]), range(200)))
        try:
            per_node = {name: 0 for name in cluster.nodes}
            for b in boxes:
                per_node[node_of(b.id)] += 1
            # The main pool is at 200 / 300 slots, below the overflow
            # threshold: nothing on the overflow node, and no main node
            # above its fair share (200 / 3) plus a margin of 20 %.
            assert per_node[OVERFLOW] == 0, per_node
            for name in MAIN:
                assert per_node[name] <= 200 / 3 * 1.2, per_node
            # The nodes agree with the ids.
            counts = cluster.counts()
            assert counts == per_node, (counts, per_node)
            # exec, cp, snapshot and destroy through either gateway reach the node.
            for i, b in enumerate(boxes[:6]):
                with cluster.client(cluster.gateways[i % 2]) as other:
                    sb = other.get(b.id)
                    r = sb.exec(["sh", "-c", "hostname >/dev/null; echo hi from $0"])
                    assert r.exit_code == 0 and r.stdout == b"hi from sh\n", r
                    sb.write_file("/tmp/x", b"payload %d" % i)
                    assert sb.read_file("/tmp/x") == b"payload %d" % i
            snap = boxes[0]
            snap.exec(["sh", "-c", "echo kept > /root/mark"])
            digest = c.get(snap.id).snapshot("trainer-cluster:1")
            assert digest
            made = c.create(["trainer-cluster:1"])
            try:
                assert made.exec(["cat", "/root/mark"]).stdout == b"kept\n"
            finally:
                made.destroy()
            # The list through a gateway is every node's.
            listed = {s.id for s in c.list()}
            assert {b.id for b in boxes} <= listed
            # An id no node of the cluster made is 404, not "node lost".
            with pytest.raises(strata.NotFound):
                c.get("sb-nosuch-0123456789ab")
        finally:
            destroy_all(c, boxes)
    assert sum(cluster.counts().values()) == 0
    cluster.wait_reported_empty()


def test_a_killed_node_gets_nothing_and_its_sandboxes_answer_node_lost_until_it_returns(cluster):
    victim = cluster.nodes["n1"]
    with cluster.client(retry_deadline=2) as c:
        kept = [c.create(["busybox:1"]) for _ in range(12)]
        on_victim = [b for b in kept if node_of(b.id) == "n1"]
        assert on_victim, "no sandbox landed on n1 in 12 creations"
        victim.kill(signal.SIGKILL)
        cluster.wait_live(set(cluster.nodes) - {"n1"}, timeout=LEASE + 10)
        made = [c.create(["busybox:1"]) for _ in range(15)]
        assert all(node_of(b.id) != "n1" for b in made)
        # Its sandboxes: 503 "node lost", naming the node.
        with pytest.raises(strata.NodeLost) as lost:
            c.get(on_victim[0].id)
        assert lost.value.node == "n1" and lost.value.status == 503 and "node lost" in str(lost.value), lost.value
        victim.start()
        cluster.wait_live(set(cluster.nodes))
        # Re-adopted, answering again.
        for b in on_victim:
            assert c.get(b.id).exec(["echo", "back"]).stdout == b"back\n"
        destroy_all(c, kept + made)


def test_creations_go_on_while_etcd_loses_members(cluster):
    etcd = cluster.etcd
    with cluster.client() as c:
        made = []
        follower = etcd.followers()[0]
        etcd.kill(follower)
        made += [c.create(["busybox:1"]) for _ in range(5)]
        leader = etcd.leader()
        etcd.kill(leader)
        # No quorum now: the gateways place from the last view they had.
        time.sleep(1)
        made += [c.create(["busybox:1"]) for _ in range(5)]
        assert len(made) == 10
        etcd.restart(follower)
        etcd.restart(leader)
        etcd.wait_healthy()
        # Registrations resume: every node's live record is fresh again.
        deadline = time.time() + 20
        while time.time() < deadline:
            records = [json.loads(v) for v in etcd.prefix("/strata/live/").values()]
            fresh = [r for r in records if r["at_ms"] > (time.time() - 2) * 1000]
            if len(fresh) == len(cluster.nodes):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"live records not refreshed: {records}")
        destroy_all(c, made)


def test_a_gateway_killed_mid_burst_makes_no_sandbox_twice(cluster):
    before = sum(cluster.counts().values())
    first, second = cluster.gateways
    with cluster.client(first, second, retry_deadline=30) as c:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(c.create, ["busybox:1"]) for _ in range(40)]
            while sum(f.done() for f in futures) < 8:
                time.sleep(0.01)
            first.kill(signal.SIGKILL)
            boxes = [f.result() for f in futures]
        try:
            assert len({b.id for b in boxes}) == 40
            # Counted on the nodes: exactly the 40 the client holds.
            assert sum(cluster.counts().values()) - before == 40, cluster.counts()
        finally:
            first.start()
            destroy_all(c, boxes)


def test_cordon_and_drain(cluster):
    env = dict(os.environ, STRATA_CLUSTER=cluster.etcd.url())
    with cluster.client() as c:
        run(LAUNCHER, "cordon", "n2", env=env)
        time.sleep(1.2)  # (the gateways' next look at etcd)
        made = [c.create(["busybox:1"]) for _ in range(12)]
        assert all(node_of(b.id) != "n2" for b in made)
        nodes = json.loads(run(LAUNCHER, "nodes", "--json", env=env).stdout)
        assert {n["name"]: n["cordoned"] for n in nodes}["n2"] is True
        run(LAUNCHER, "uncordon", "n2", env=env)
        time.sleep(1.2)
        on_n2 = []
        for _ in range(30):
            b = c.create(["busybox:1"])
            (on_n2 if node_of(b.id) == "n2" else made).append(b)
            if len(on_n2) >= 2:
                break
        assert on_n2, "nothing placed on n2 after uncordon"
        # Drain waits for n2's sandboxes to go.
        drain = subprocess.Popen([LAUNCHER, "drain", "n2", "--timeout", "60s"], env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert drain.poll() is None, drain.stderr.read()
        destroy_all(c, on_n2)
        assert drain.wait(timeout=30) == 0, drain.stderr.read()
        # A drain past its deadline fails and leaves the node cordoned.
        run(LAUNCHER, "uncordon", "n2", env=env)
        destroy_all(c, made)
    assert run(LAUNCHER, "drain", "n3", "--timeout", "1s", env=env).returncode == 0  # (n3 holds nothing now)
    run(LAUNCHER, "uncordon", "n3", env=env)


def test_the_overflow_pool_gets_work_only_above_the_threshold(cluster):
    with cluster.client() as c:
        below = [c.create(["busybox:1"], backend="fncall") for _ in range(20)]
        assert all(node_of(b.id) != OVERFLOW for b in below)
        # Fill the main pool to exactly 80 % of its 300 slots with
        # function-call sandboxes (cheap: one warm sandbox per node serves
        # them all), made on the nodes themselves so the count is exact.
        fill = []
        for name in MAIN:
            direct = strata.Client("unix://" + cluster.nodes[name].socket)
            fill += direct.create(["busybox:1"], backend="fncall",
                                  count=int(THRESHOLD * SLOTS) - sum(node_of(x.id) == name for x in below))
        time.sleep(2.5)  # (the nodes' next reports reach the gateways)
        first = c.create(["busybox:1"], backend="fncall")  # 240 of 300: not above 80 %
        assert node_of(first.id) != OVERFLOW
        above = [c.create(["busybox:1"], backend="fncall") for _ in range(12)]
        assert any(node_of(b.id) == OVERFLOW for b in above), [b.id for b in above]
        destroy_all(c, below + [first] + above)
        destroy_all(None, fill)


def test_each_nodes_recovery_leaves_the_others_sandboxes_alone(cluster):
    with cluster.client() as c:
        boxes = [c.create(["busybox:1"]) for _ in range(8)]
        by_node = {}
        for b in boxes:
            by_node.setdefault(node_of(b.id), []).append(b)
        # Every node restarted (kill -9): each re-adopts its own, none removes another's.
        for n in cluster.nodes.values():
            n.kill(signal.SIGKILL)
            n.start()
        cluster.wait_live(set(cluster.nodes))
        for b in boxes:
            assert c.get(b.id).exec(["true"]).exit_code == 0
        destroy_all(c, boxes)


def test_two_daemons_sharing_a_setting_refuse_to_start(cluster):
    n = cluster.nodes["n3"]
    # Another daemon given n3's uppers (its own everything else) is refused, naming the setting.
    env = dict(n.env, STRATA_RUN_DIR=n.env["STRATA_RUN_DIR"] + "-2", STRATA_LAZYFS_SOCKET=n.env["STRATA_LAZYFS_SOCKET"] + "-2",
               STRATA_CACHE=n.env["STRATA_CACHE"] + "-2", STRATA_CGROUP_PARENT=n.cgroup + "-2")
    state = os.path.join(n.dir, "state-2")
    r = subprocess.run([LAUNCHER, "serve", "--socket", os.path.join(n.dir, "l2.sock"), "--state", state], env=env,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "STRATA_UPPERS" in r.stderr and "in use by another launcher daemon" in r.stderr, r.stderr
    # And the node name.
    env2 = dict(env, STRATA_UPPERS=os.path.join(UPPERS, ".pytest-claims-x"))
    r = subprocess.run([LAUNCHER, "serve", "--socket", os.path.join(n.dir, "l2.sock"), "--state", state, "--node", "n3"],
                       env=env2, capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "--node" in r.stderr, r.stderr
    assert n.proc.poll() is None
    shutil.rmtree(state, ignore_errors=True)


def test_only_a_gateway_credential_names_a_tenant(cluster):
    import httpx
    node = cluster.nodes["n1"]
    gw_token = open(os.path.join(cluster.root, "gateway-credential")).read().strip()
    url = "https://" + node.address
    with httpx.Client(verify=cluster.cert) as h:
        # A tenant's token naming someone else: refused, never taken on trust.
        r = h.get(url + "/v1/sandboxes", headers={"Authorization": "Bearer " + cluster.tenant, "X-Strata-Tenant": "gw"})
        assert r.status_code == 403, r.text
        # No token at all, just the header: 401.
        r = h.get(url + "/v1/sandboxes", headers={"X-Strata-Tenant": "trainer"})
        assert r.status_code == 401, r.text
        # The gateway's credential naming a tenant the node does not know: 401.
        r = h.get(url + "/v1/sandboxes", headers={"Authorization": "Bearer " + gw_token, "X-Strata-Tenant": "nobody"})
        assert r.status_code == 401, r.text
        # Naming a known tenant: that tenant's view (its own sandboxes only).
        r = h.get(url + "/v1/sandboxes", headers={"Authorization": "Bearer " + gw_token, "X-Strata-Tenant": "trainer"})
        assert r.status_code == 200 and isinstance(r.json(), list), r.text
        # The credential is for nodes: a gateway refuses it from a caller.
        r = h.get(cluster.gateways[1].url + "/v1/sandboxes", headers={"Authorization": "Bearer " + gw_token})
        assert r.status_code == 403, r.text
        # A gateway answers health without a token (readiness probes).
        r = h.get(cluster.gateways[1].url + "/v1/health")
        assert r.status_code == 200 and r.json()["nodes"]["live"] == len(cluster.nodes), r.text


def test_the_gateway_passes_refusals_on_as_the_node_gave_them(cluster):
    import httpx
    gw = cluster.gateways[0].url
    auth = {"Authorization": "Bearer " + cluster.tenant}
    with httpx.Client(verify=cluster.cert) as h:
        # An upload the node refuses at once (no such sandbox there): the
        # node's 404, not a gateway error, however much body follows.
        r = h.put(gw + "/v1/sandboxes/sb-n1-000000000000/files", params={"path": "/tmp/x"}, headers=auth,
                  content=b"x" * (4 << 20))
        assert r.status_code == 404, r.text
    # A path that a dot segment would make another call on the node (sent
    # as it is: clients normally fold dot segments away).
    out = run("curl", "-s", "--path-as-is", "--cacert", cluster.cert, "-H", auth["Authorization"].join(["Authorization: ", ""]),
              "-o", "/dev/null", "-w", "%{http_code}", gw + "/v1/sandboxes/sb-n1-000000000000/../../keys?key=k").stdout
    assert out == "400", out
