// A real launcher daemon for the e2b SDK's tests: its own store with a
// busybox layer (with /bin/bash and the account "user" E2B's clients
// expect), lazyfs daemon, run directory, cgroup parent and uppers, two
// tenants, listening on loopback over plain HTTP. stop() removes all it
// made, also after a failed test.
import { execFileSync, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
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

export class Node {
  // `tls`: the listener serves HTTPS with a certificate made here (this.cert).
  constructor({ tls = false } = {}) {
    this.tls = tls;
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
    const err = fs.openSync(this.log, 'a');
    this.proc = spawn(LAUNCHER, ['serve', '--socket', this.socket, '--state', path.join(this.root, 'state'), '--tokens', this.tokens,
      '--listen', '127.0.0.1:0', '--store', this.store, ...tls], { env: this.env, stdio: ['ignore', 'ignore', err], detached: true });
    for (let i = 0; i < 2000; i++) {
      const text = fs.readFileSync(this.log, 'utf8');
      const m = text.match(/serving on (https?:\/\/127\.0\.0\.1:\d+)/);
      if (m) {
        this.url = m[1];
        break;
      }
      if (this.proc.exitCode !== null) throw new Error('the daemon exited: ' + text);
      await new Promise((r) => setTimeout(r, 10));
    }
    if (!this.url) throw new Error('the daemon did not start: ' + fs.readFileSync(this.log, 'utf8'));
    this.run(LAUNCHER, ['template', 'set', 'base', '--layer', 'busybox:1', '--socket', this.socket]);
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
    if (this.proc && this.proc.exitCode === null) {
      const exited = new Promise((r) => this.proc.once('exit', r));
      process.kill(-this.proc.pid, 'SIGTERM');
      await exited;
    }
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
