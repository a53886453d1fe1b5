// A real launcher daemon for the e2b SDK's tests: its own store with a
// busybox layer (with /bin/bash and the account "user" E2B's clients
// expect), lazyfs daemon, run directory, cgroup parent and uppers, two
// tenants, listening on loopback over plain HTTP. With `cluster`, the node
// is the one member of a cluster on a one-member etcd (Debian's
// etcd-server) and `url` is a gateway's in front of it. stop() removes all
// it made, also after a failed test.
import { execFileSync, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const BUILD = process.env.STRATA_BUILD_DIR ?? path.join(import.meta.dirname, '..', '..', 'build');
// The pinned npm packages (scripts/setup installs them there).
export const requireNpm = createRequire(path.join(BUILD, 'npm', 'package.json'));
export const LAUNCHER = path.join(BUILD, 'launcher', 'launcher');
const LAYERCTL = path.join(BUILD, 'layerctl', 'layerctl');
const UPPERS = '/var/lib/strata/uppers';
const CONTROLLERS = ['blkio', 'cpu', 'cpuacct', 'cpuset', 'devices', 'freezer', 'hugetlb', 'memory', 'pids', 'systemd', 'unified'];

function busyboxTree(dir) {
  for (const d of ['bin', 'proc', 'sys', 'dev', 'tmp', 'etc', 'root', 'mnt', 'home/user']) fs.mkdirSync(path.join(dir, d), { recursive: true });
  fs.copyFileSync('/bin/busybox', path.join(dir, 'bin', 'busybox'));
  fs.chmodSync(path.join(dir, 'bin', 'busybox'), 0o755);
  for (const a of execFileSync('/bin/busybox', ['--list'], { encoding: 'utf8' }).split('\n')) {
    if (a && a !== 'busybox') fs.symlinkSync('busybox', path.join(dir, 'bin', a));
  }
  // E2B's clients run commands as `/bin/bash -l -c CMD`.
  fs.writeFileSync(path.join(dir, 'bin', 'bash'), '#!/bin/sh\nexec /bin/sh "$@"\n', { mode: 0o755 });
  fs.writeFileSync(path.join(dir, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/bash\n');
  fs.writeFileSync(path.join(dir, 'etc', 'group'), 'root:x:0:\nuser:x:1000:\n');
  fs.chmodSync(path.join(dir, 'tmp'), 0o1777);
  fs.chownSync(path.join(dir, 'home', 'user'), 1000, 1000);
}

async function freePort() {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

// Until `log` shows `pattern` (its first group), or `proc` exits.
async function waitFor(proc, log, pattern, what) {
  for (let i = 0; i < 2000; i++) {
    const text = fs.readFileSync(log, 'utf8');
    const m = text.match(pattern);
    if (m) return m[1];
    if (proc.exitCode !== null) throw new Error(`${what} exited: ${text}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`${what} did not start: ${fs.readFileSync(log, 'utf8')}`);
}

async function stopProcess(p) {
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise((r) => p.once('exit', r));
  process.kill(-p.pid, 'SIGTERM');
  await exited;
}

export class Node {
  // `tls`: the listener serves HTTPS with a certificate made here (this.cert).
  constructor({ tls = false, cluster = false } = {}) {
    this.tls = tls;
    this.cluster = cluster;
    this.root = fs.mkdtempSync(path.join(os.tmpdir(), 'strata-e2b-'));
    fs.chmodSync(this.root, 0o711);
    const base = path.basename(this.root);
    this.socket = path.join(this.root, 'launcher.sock');
    this.log = path.join(this.root, 'daemon.log');
    this.tokens = path.join(this.root, 'tokens');
    this.store = 'file://' + path.join(this.root, 'store');
    this.cert = path.join(this.root, 'cert.pem');
    this.key = path.join(this.root, 'key.pem');
    this.cgroup = 'strata-e2b-' + base;
    this.uppers = path.join(UPPERS, '.e2b-' + base);
    this.env = {
      ...process.env, STRATA_STORE: this.store, STRATA_LAZYFS_SOCKET: path.join(this.root, 'lazyfs.sock'),
      STRATA_CACHE: path.join(this.root, 'cache'), STRATA_RUN_DIR: path.join(this.root, 'run'),
      STRATA_CGROUP_PARENT: this.cgroup, STRATA_UPPERS: this.uppers,
    };
  }

  run(tool, args) {
    return execFileSync(tool, args, { env: this.env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  }

  token(name, ...limits) {
    return this.run(LAUNCHER, ['token', 'new', name, '--tokens', this.tokens, ...limits]).trim();
  }

  async start() {
    fs.mkdirSync(this.uppers, { mode: 0o700 });
    const tree = path.join(this.root, 'busybox');
    busyboxTree(tree);
    this.run(LAYERCTL, ['build', tree, '-o', path.join(this.root, 'layer'), '--name', 'busybox', '--tag', 'busybox:1']);
    this.tenant = this.token('trainer');
    this.other = this.token('other');
    const tls = [];
    if (this.tls) {
      this.run('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', this.key,
        '-out', this.cert, '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1']);
      tls.push('--tls-cert', this.cert, '--tls-key', this.key);
    }
    const member = [];
    // The gateway's credential on the node (a token of the same file, whose tenants the gateway shares).
    const credential = path.join(this.root, 'gateway-credential');
    if (this.cluster) {
      fs.writeFileSync(credential, this.token('gw', '--gateway') + '\n', { mode: 0o600 });
      await this.startEtcd();
      member.push('--node', 'n1', '--cluster', this.etcdUrl, '--lease', '3');
    }
    this.proc = spawn(LAUNCHER, ['serve', '--socket', this.socket, '--state', path.join(this.root, 'state'), '--tokens', this.tokens,
      '--listen', '127.0.0.1:0', '--store', this.store, ...tls, ...member], { env: this.env, stdio: ['ignore', 'ignore', fs.openSync(this.log, 'a')], detached: true });
    this.url = this.nodeUrl = await waitFor(this.proc, this.log, /serving on (https?:\/\/127\.0\.0\.1:\d+)/, 'the daemon');
    this.run(LAUNCHER, ['template', 'set', 'base', '--layer', 'busybox:1', '--socket', this.socket]);
    if (this.cluster) {
      const log = path.join(this.root, 'gateway.log');
      this.gateway = spawn(LAUNCHER, ['gateway', '--cluster', this.etcdUrl, '--listen', '127.0.0.1:0', '--tokens', this.tokens,
        '--node-token', credential, '--insecure'], { env: this.env, stdio: ['ignore', 'ignore', fs.openSync(log, 'a')], detached: true });
      this.url = await waitFor(this.gateway, log, /gateway serving on (http:\/\/127\.0\.0\.1:\d+)/, 'the gateway');
      // Until the gateway sees the node live.
      for (let i = 0; ; i++) {
        const r = await (await fetch(this.url + '/v1/health')).json();
        if (r.nodes.live === 1) break;
        if (i > 200) throw new Error('the gateway never saw the node: ' + JSON.stringify(r));
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  // One etcd member on loopback ports of its own, its data in this.root.
  async startEtcd() {
    const [client, peer] = [await freePort(), await freePort()];
    this.etcdUrl = `http://127.0.0.1:${client}`;
    const log = path.join(this.root, 'etcd.log');
    this.etcd = spawn('/usr/bin/etcd', ['--name', 'e1', '--data-dir', path.join(this.root, 'etcd'),
      '--listen-client-urls', this.etcdUrl, '--advertise-client-urls', this.etcdUrl,
      '--listen-peer-urls', `http://127.0.0.1:${peer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${peer}`,
      '--initial-cluster', `e1=http://127.0.0.1:${peer}`, '--initial-cluster-state', 'new'],
      { stdio: ['ignore', 'ignore', fs.openSync(log, 'a')], detached: true });
    for (let i = 0; ; i++) {
      try {
        const r = await fetch(this.etcdUrl + '/health');
        if (r.ok && (await r.json()).health === 'true') return;
      } catch {}
      if (this.etcd.exitCode !== null || i > 400) throw new Error('etcd did not start: ' + fs.readFileSync(log, 'utf8').slice(-3000));
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  sandboxes() {
    return JSON.parse(this.run(LAUNCHER, ['ls', '--json', '--socket', this.socket]));
  }

  async stop() {
    try {
      for (const s of this.sandboxes()) {
        try { this.run(LAUNCHER, ['destroy', s.id, '--socket', this.socket]); } catch {}
      }
    } catch {}
    for (const p of [this.gateway, this.proc, this.etcd]) await stopProcess(p);
    const lazyfs = 'lazyfs daemon --socket ' + this.env.STRATA_LAZYFS_SOCKET;
    try { execFileSync('pkill', ['-TERM', '-f', lazyfs]); } catch {}
    for (let i = 0; i < 500; i++) {
      try { execFileSync('pgrep', ['-f', lazyfs]); } catch { break; }
      await new Promise((r) => setTimeout(r, 10));
    }
    for (const c of CONTROLLERS) {
      try { fs.rmdirSync(`/sys/fs/cgroup/${c}/${this.cgroup}`); } catch {}
    }
    try { fs.rmdirSync(`/sys/fs/cgroup/cpu/${this.cgroup}-node`); } catch {}
    fs.rmSync(path.join(this.uppers, '.vm-templates'), { recursive: true, force: true });
    try { fs.rmdirSync(path.join(this.uppers, '.snapshots')); } catch {}
    try { fs.rmdirSync(this.uppers); } catch (e) { console.error(`uppers directory left: ${this.uppers}: ${e}`); }
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}
