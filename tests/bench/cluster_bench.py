"""scripts/bench cluster: the cluster's costs against baselines measured in
the same run, on the test cluster of tests/python/test_cluster.py (a
three-member etcd, four node daemons, two gateways, all on this machine):
  - creations per second through one gateway to the four nodes, against
    the same creations sent straight to the nodes (round robin), and
    through nginx proxy_pass to one node against straight to that node
    (a bare proxy's cost); container and function-call sandboxes, 8 in
    flight, rounds interleaved, the median round;
  - the gateway's placement decisions per second in-process (160 nodes);
  - the etcd writes per second 160 nodes' registrations cause (simulated
    with the daemon's own Registrar), beside etcd's own put rate here.
Usage: /usr/bin/python3 tests/bench/cluster_bench.py [CREATES] [ROUNDS]"""

import concurrent.futures
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import test_cluster  # noqa: E402  (the cluster the tests run)
import strata  # noqa: E402
from bench_table import table  # noqa: E402

test_cluster.SLOTS = 2000  # (room for every round's sandboxes)
BENCH = os.path.join(test_cluster.LAUNCHER.rsplit("/launcher/", 1)[0], "tests", "bench", "cluster_bench")
PARALLEL = 8


def nginx_to(cluster, node):
    """nginx proxy_pass over TLS to one node, with keep-alive upstream
    connections, listening with TLS on loopback like a gateway."""
    d = os.path.join(cluster.root, "nginx")
    os.makedirs(d)
    port = test_cluster.free_port("127.0.0.10")
    upstream = node.address
    conf = f"""daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  upstream node {{ server {upstream}; keepalive 32; }}
  server {{
    listen 127.0.0.10:{port} ssl;
    ssl_certificate {cluster.cert};
    ssl_certificate_key {cluster.root}/key.pem;
    location / {{
      proxy_pass https://node;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # (nginx 1.22 does not match a certificate's IP names: no verification
      # on this loopback hop; the handshakes and their cost are the same)
      proxy_ssl_verify off;
      proxy_ssl_session_reuse on;
      proxy_buffering off;
    }}
  }}
}}
"""
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["nginx", "-p", d, "-c", os.path.join(d, "nginx.conf"), "-e", os.path.join(d, "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"https://127.0.0.10:{port}"
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with strata.Client(url, token=cluster.tenant, verify=cluster.cert, retry_deadline=1) as c:
                c.health()
                return proc, url
        except Exception:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nginx did not start: " + open(os.path.join(d, "error.log")).read())


def rate(clients, n, backend):
    """n creations, PARALLEL at a time, client i % len(clients): per second."""
    made = [None] * n

    def one(i):
        made[i] = clients[i % len(clients)].create(["busybox:1"], backend=backend)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(one, range(n)))
    elapsed = time.perf_counter() - start
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:  # (not timed)
        list(pool.map(lambda b: b.destroy(), made))
    return n / elapsed


def bench_json(*argv):
    return json.loads(subprocess.run([BENCH, *argv], check=True, capture_output=True, text=True).stdout)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    cluster = test_cluster.Cluster()
    nginx = None
    try:
        cluster.start()
        one = cluster.nodes["n2"]
        nginx, nginx_url = nginx_to(cluster, one)
        mk = lambda url: strata.Client(url, token=cluster.tenant, verify=cluster.cert)
        paths = {
            "gateway": [mk(cluster.gateways[0].url)],
            "direct": [mk("https://" + cluster.nodes[m].address) for m in test_cluster.MAIN],
            "nginx": [mk(nginx_url)],
            "one node": [mk("https://" + one.address)],
        }
        # The gateway places on the three main nodes (the fourth is the
        # overflow pool): "direct" spreads over the same three.
        results = {(p, b): [] for p in paths for b in ("container", "fncall")}
        for backend in ("container", "fncall"):
            for p in paths:  # a warm-up round each (lazyfs mounts, pools, connections)
                rate(paths[p], 16, backend)
            for _ in range(rounds):
                for p in paths:
                    results[(p, backend)].append(rate(paths[p], n, backend))
        placement = bench_json("placement")
        regs = bench_json("registrations", cluster.etcd.url(), "160", "10")
        cap = bench_json("capacity", cluster.etcd.url(), "16", "5")
    finally:
        if nginx:
            nginx.kill()
            nginx.wait()
        cluster.stop()

    med = {k: statistics.median(v) for k, v in results.items()}
    rows = []
    for backend in ("container", "fncall"):
        g, d, x, o = (med[(p, backend)] for p in ("gateway", "direct", "nginx", "one node"))
        rows.append([f"creations/s, {backend}, through a gateway to the nodes", f"{g:.1f}", f"straight to the nodes {d:.1f}",
                     f"{g / d:.2f} (overhead {100 * (1 - g / d):.0f} %; target <= 10 %)"])
        rows.append([f"creations/s, {backend}, nginx proxy_pass to one node", f"{x:.1f}", f"straight to that node {o:.1f}",
                     f"{x / o:.2f} (a bare proxy: {100 * (1 - x / o):.0f} %)"])
    rows.append(["placement decisions/s, 160 nodes, one thread", f"{placement['nodes_160_1_thread']:,.0f}",
                 f"4 nodes {placement['nodes_4_1_thread']:,.0f}", "target >= 50,000/s"])
    rows.append(["placement decisions/s, 160 nodes, two threads (one Placer)", f"{placement['nodes_160_2_threads']:,.0f}", "", ""])
    rows.append(["etcd writes/s caused by 160 nodes' registrations", f"{regs['writes_per_second']:.0f}",
                 f"etcd's put rate here, 16 writers: {cap['puts_per_second']:.0f}",
                 f"{regs['writes_per_second'] / cap['puts_per_second']:.2f} of it ({regs['record_bytes']} B a record)"])
    print(f"{n} creations a round, {PARALLEL} in flight, median of {rounds} interleaved rounds; "
          f"per round: {json.dumps({f'{p}/{b}': [round(x, 1) for x in v] for (p, b), v in results.items()})}")
    print()
    table(["", "ours", "baseline (same run)", "ratio"], rows)


if __name__ == "__main__":
    main()
