// E2B's own SDK (npm e2b, pinned in tests/npm) against a real strata
// daemon: the control plane, commands and files, with nothing changed but
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (docs/e2b.md). With
// STRATA_E2B_THROUGH=gateway the same calls go through a real gateway in
// front of the node (a cluster of one on a one-member etcd).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import { after, before, describe, test } from 'node:test';

import { Node, requireNpm } from './node.mjs';

const throughGateway = process.env.STRATA_E2B_THROUGH === 'gateway';
const node = new Node({ cluster: throughGateway });
let e2b;

before(async () => {
  await node.start();
  process.env.E2B_API_URL = node.url;
  process.env.E2B_SANDBOX_URL = node.url;
  process.env.E2B_API_KEY = node.tenant;
  e2b = requireNpm('e2b');
});

after(async () => {
  await node.stop();
});

async function fresh(opts = {}) {
  return e2b.Sandbox.create('base', { timeoutMs: 120_000, ...opts });
}

describe('the control plane', () => {
  test('create, describe, list by metadata, kill', async () => {
    const sbx = await fresh({ metadata: { run: 'r1', step: '7' } });
    assert.match(sbx.sandboxId, /^sb-/);
    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.equal(info.templateId, 'base');
    assert.deepEqual(info.metadata, { run: 'r1', step: '7' });
    assert.equal(info.state, 'running');
    assert.ok(info.endAt.getTime() > Date.now() + 60_000);
    const found = await e2b.Sandbox.list({ query: { metadata: { run: 'r1' } } }).nextItems();
    assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId]);
    const none = await e2b.Sandbox.list({ query: { metadata: { run: 'nope' } } }).nextItems();
    assert.equal(none.length, 0);
    assert.equal(await sbx.kill(), true);
    assert.equal(await e2b.Sandbox.kill(sbx.sandboxId), false);
    assert.equal(node.sandboxes().length, 0);
  });

  test('a list pages by limit and nextToken', async () => {
    const made = await Promise.all([1, 2, 3].map(() => fresh({ metadata: { page: 'p' } })));
    try {
      const pager = e2b.Sandbox.list({ limit: 2, query: { metadata: { page: 'p' } } });
      const first = await pager.nextItems();
      assert.equal(first.length, 2);
      assert.equal(pager.hasNext, true);
      const second = await pager.nextItems();
      assert.equal(second.length, 1);
      assert.equal(pager.hasNext, false);
      assert.deepEqual([...first, ...second].map((s) => s.sandboxId).sort(), made.map((s) => s.sandboxId).sort());
    } finally {
      await Promise.all(made.map((s) => s.kill()));
    }
  });

  test('through the gateway, calls are placed and passed on by it', { skip: !throughGateway && 'no gateway in this run' }, async () => {
    const sbx = await fresh();
    try {
      assert.match(sbx.sandboxId, /^sb-n1-/);  // (the one node's name is in its id)
      assert.equal((await sbx.commands.run('echo via')).stdout, 'via\n');
      const metrics = await (await fetch(node.url + '/metrics', { headers: { authorization: 'Bearer ' + node.tenant } })).text();
      const count = (name) => Number(metrics.match(new RegExp(`^${name} (\\d+)`, 'm'))?.[1] ?? 0);
      assert.ok(count('strata_gateway_creates_total') >= 1, metrics);
      assert.ok(count('strata_gateway_forwarded_total') >= 3, metrics);
      // A sandbox id of no node of the cluster, on both planes.
      const r = await fetch(node.url + '/sandboxes/sb-nowhere-1', { headers: { 'X-API-KEY': node.tenant } });
      assert.equal(r.status, 404);
      assert.equal((await r.json()).code, 404);
      const health = await fetch(node.url + '/health', { headers: { 'E2b-Sandbox-Id': 'sb-nowhere-1', 'X-Access-Token': 'x' } });
      assert.equal(health.status, 502);
    } finally {
      await sbx.kill();
    }
  });

  test('an unknown template is a clear error, and no sandbox is made', async () => {
    await assert.rejects(e2b.Sandbox.create('no-such-template'), /template "?no-such-template"? not found/);
    assert.equal(node.sandboxes().length, 0);
  });

  test('a wrong key is refused', async () => {
    await assert.rejects(e2b.Sandbox.create('base', { apiKey: 'not-a-token' }), e2b.AuthenticationError);
  });

  test("another tenant's sandbox is not found on either plane", async () => {
    const sbx = await fresh();
    try {
      await assert.rejects(e2b.Sandbox.connect(sbx.sandboxId, { apiKey: node.other }), e2b.SandboxNotFoundError);
      assert.equal(await e2b.Sandbox.kill(sbx.sandboxId, { apiKey: node.other }), false);
      const theirs = await e2b.Sandbox.list({ apiKey: node.other }).nextItems();
      assert.equal(theirs.length, 0);
    } finally {
      await sbx.kill();
    }
  });

  test('setTimeout moves the end; pause, then connect resumes', async () => {
    const sbx = await fresh();
    try {
      await sbx.setTimeout(30_000);
      const info = await sbx.getInfo();
      assert.ok(info.endAt.getTime() < Date.now() + 40_000, `endAt ${info.endAt}`);
      await sbx.pause();
      assert.equal((await sbx.getInfo()).state, 'paused');
      const again = await e2b.Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 });
      assert.equal((await again.getInfo()).state, 'running');
      const r = await again.commands.run('echo back');
      assert.equal(r.stdout, 'back\n');
    } finally {
      await sbx.kill();
    }
  });

  test('a sandbox ends at its timeout, even with a command attached', async () => {
    const sbx = await fresh();
    const h = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 0 });
    await sbx.setTimeout(1_000);
    const until = Date.now() + 15_000;
    while (node.sandboxes().some((s) => s.id === sbx.sandboxId) && Date.now() < until) await new Promise((r) => setTimeout(r, 200));
    assert.ok(!node.sandboxes().some((s) => s.id === sbx.sandboxId), 'the sandbox outlived its timeout');
    await assert.rejects(h.wait());
    assert.equal(await sbx.isRunning(), false);
  });

  test('getMetrics: CPU, memory and disk now, for one sandbox or many', async () => {
    const sbx = await fresh();
    const other = await fresh();
    try {
      await sbx.commands.run('dd if=/dev/zero of=big bs=1M count=16 2>/dev/null && sync && i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done');
      const metrics = await sbx.getMetrics();
      assert.equal(metrics.length, 1);
      const [m] = metrics;
      assert.ok(Math.abs(m.timestamp.getTime() - Date.now()) < 10_000, `timestamp ${m.timestamp}`);
      assert.ok(m.cpuCount >= 1);
      assert.ok(m.cpuUsedPct > 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`);
      assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed} of ${m.memTotal}`);
      assert.ok(m.memCache <= m.memUsed);
      assert.ok(m.diskUsed >= 16 << 20 && m.diskUsed < 32 << 20, `diskUsed ${m.diskUsed}`);
      assert.ok(m.diskTotal > m.diskUsed);
      // The node keeps no history: an interval that ended an hour ago has none.
      const hourAgo = Date.now() - 3_600_000;
      assert.deepEqual(await sbx.getMetrics({ start: new Date(hourAgo - 60_000), end: new Date(hourAgo) }), []);
      // Idle since the last one asked.
      const [idle] = await e2b.Sandbox.getMetrics(sbx.sandboxId);
      assert.ok(idle.cpuUsedPct < 50, `idle cpuUsedPct ${idle.cpuUsedPct}`);
      // Several at once: those of the caller's that are there.
      const many = async (key) => {
        const r = await fetch(`${node.url}/sandboxes/metrics?sandbox_ids=${sbx.sandboxId},${other.sandboxId},sb-n1-gone`, { headers: { 'X-API-KEY': key } });
        assert.equal(r.status, 200);
        return (await r.json()).sandboxes;
      };
      assert.deepEqual(Object.keys(await many(node.tenant)).sort(), [sbx.sandboxId, other.sandboxId].sort());
      assert.deepEqual(await many(node.other), {});
      await assert.rejects(e2b.Sandbox.getMetrics(sbx.sandboxId, { apiKey: node.other }), e2b.SandboxNotFoundError);
    } finally {
      await sbx.kill();
      await other.kill();
    }
  });

  test("E2B's template build API says where templates come from", async () => {
    const r = await fetch(node.url + '/v3/templates', { method: 'POST', headers: { 'X-API-KEY': node.tenant, 'content-type': 'application/json' }, body: '{}' });
    assert.equal(r.status, 400);
    assert.match((await r.json()).message, /layerctl/);
  });
});

describe('commands', () => {
  let sbx;
  before(async () => { sbx = await fresh({ envs: { TASK: 't-9', GREETING: 'not this' } }); });
  after(async () => { await sbx.kill(); });

  test('run in the foreground: output, exit code, env and cwd', async () => {
    const r = await sbx.commands.run('echo "$GREETING $TASK" && pwd && echo oops >&2', { envs: { GREETING: 'hello' }, cwd: '/tmp' });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'hello t-9\n/tmp\n');
    assert.equal(r.stderr, 'oops\n');
  });

  test('commands run as "user" in its home, or as root when asked', async () => {
    const r = await sbx.commands.run('id -u; echo $HOME; pwd; touch mine && stat -c %U mine');
    assert.equal(r.stdout, '1000\n/home/user\n/home/user\nuser\n');
    const root = await sbx.commands.run('id -u; echo $HOME; pwd', { user: 'root' });
    assert.equal(root.stdout, '0\n/root\n/root\n');
    await assert.rejects(sbx.commands.run('true', { user: 'nobody-here' }), /nobody-here/);
  });

  test('a failing command is CommandExitError with its exit code and output', async () => {
    await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => {
      assert.ok(e instanceof e2b.CommandExitError);
      assert.equal(e.exitCode, 3);
      assert.equal(e.stdout, 'partial\n');
      return true;
    });
  });

  test('output streams as it comes', async () => {
    const seen = [];
    const r = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.2; done', { onStdout: (d) => seen.push([d, Date.now()]) });
    assert.equal(r.stdout, '1\n2\n3\n');
    assert.ok(seen.length >= 2, `pieces: ${JSON.stringify(seen)}`);
    assert.ok(seen.at(-1)[1] - seen[0][1] >= 200);
  });

  test('in the background: listed, killed, and its wait ends', async () => {
    const h = await sbx.commands.run('sleep 60', { background: true });
    assert.ok(h.pid > 0);
    const listed = await sbx.commands.list();
    assert.ok(listed.some((p) => p.pid === h.pid), JSON.stringify(listed));
    assert.equal(await sbx.commands.kill(h.pid), true);
    await assert.rejects(h.wait(), e2b.CommandExitError);
    assert.equal(await sbx.commands.kill(h.pid), false);
  });

  test('stdin: sent in pieces, then closed', async () => {
    const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true });
    await sbx.commands.sendStdin(h.pid, 'hello ');
    await sbx.commands.sendStdin(h.pid, 'world\n');
    await sbx.commands.closeStdin(h.pid);
    const r = await h.wait();
    assert.equal(r.stdout, 'hello world\ndone\n');
    // A command started without stdin has none to write to.
    const quiet = await sbx.commands.run('sleep 5', { background: true });
    await assert.rejects(sbx.commands.sendStdin(quiet.pid, 'x'), /stdin/);
    await sbx.commands.kill(quiet.pid);
  });

  test('connect to a running command sees its output to come', async () => {
    const h = await sbx.commands.run('sleep 0.5; echo late', { background: true });
    const joined = await sbx.commands.connect(h.pid);
    const r = await joined.wait();
    assert.equal(r.stdout, 'late\n');
  });
});

describe('pty', () => {
  let sbx;
  before(async () => { sbx = await fresh(); });
  after(async () => { await sbx.kill(); });

  // A terminal's output so far, and a wait until it shows `pattern`.
  function screen() {
    const text = { all: '' };
    const decoder = new TextDecoder();
    text.onData = (bytes) => { text.all += decoder.decode(bytes, { stream: true }); };
    text.until = async (pattern) => {
      const end = Date.now() + 10_000;
      while (!pattern.test(text.all)) {
        if (Date.now() > end) throw new Error(`no ${pattern} on the terminal: ${JSON.stringify(text.all)}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    return text;
  }

  test('a terminal: its size, input and output, a resize, reconnecting, kill', async () => {
    const out = screen();
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: out.onData, timeoutMs: 0 });
    assert.ok(term.pid > 0);
    const type = (text) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(text));
    // (The shell echoes what is typed: each answer is one the echo cannot show.)
    await type('stty size; tty; echo "v=$((6*7)) $TERM"\n');
    await out.until(/v=42 xterm-256color/);
    assert.match(out.all, /24 80/);
    assert.match(out.all, /\/dev\/pts\/\d+/);
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
    await type('stty size\n');
    await out.until(/30 100/);
    // Another client joins the same terminal and sees what comes next.
    const later = screen();
    const joined = await sbx.pty.connect(term.pid, { onData: later.onData });
    await type('echo "w=$((7*8))"\n');
    await later.until(/w=56/);
    assert.ok((await sbx.commands.list()).some((p) => p.pid === term.pid));
    assert.equal(await sbx.pty.kill(term.pid), true);
    await assert.rejects(term.wait(), e2b.CommandExitError);
    await assert.rejects(joined.wait(), e2b.CommandExitError);
    assert.equal(await sbx.pty.kill(term.pid), false);
  });

  test('resizing a command without a terminal is an error', async () => {
    const h = await sbx.commands.run('sleep 5', { background: true });
    await assert.rejects(sbx.pty.resize(h.pid, { cols: 10, rows: 10 }), /no pty/);
    await sbx.commands.kill(h.pid);
  });
});

describe('files', () => {
  let sbx;
  before(async () => { sbx = await fresh(); });
  after(async () => { await sbx.kill(); });

  test('write then read, text and bytes, relative to the home', async () => {
    const info = await sbx.files.write('notes/a.txt', 'hello file');
    assert.equal(info.path, '/home/user/notes/a.txt');
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello file');
    const bytes = new Uint8Array(256).map((_, i) => i);
    await sbx.files.write('/tmp/bin', bytes.buffer);
    assert.deepEqual(await sbx.files.read('/tmp/bin', { format: 'bytes' }), bytes);
    const r = await sbx.commands.run('cat /home/user/notes/a.txt && stat -c %U /home/user/notes/a.txt && echo more >> notes/a.txt');
    assert.equal(r.stdout, 'hello fileuser\n');
    assert.equal((await sbx.files.getInfo('/home/user/notes/a.txt')).owner, 'user');
    await sbx.files.write('/tmp/by-root', 'x', { user: 'root' });
    assert.equal((await sbx.files.getInfo('/tmp/by-root')).owner, 'root');
  });

  test('gzip uploads are decoded as they arrive; a damaged or cut one writes nothing', async () => {
    const text = 'gz '.repeat(50_000);
    await sbx.files.write('/tmp/gz.txt', text, { gzip: true });
    assert.equal(await sbx.files.read('/tmp/gz.txt'), text);
    assert.equal(await sbx.files.read('/tmp/gz.txt', { gzip: true }), text);  // (Accept-Encoding: answered as it is)
    const detail = await (await fetch(`${node.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': node.tenant } })).json();
    const post = (path, body, encoding) => fetch(`${node.url}/files?path=${path}`, {
      method: 'POST', body,
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': detail.envdAccessToken, 'content-type': 'application/octet-stream', 'content-encoding': encoding },
    });
    // Members one after another are one body.
    let r = await post('/tmp/two', Buffer.concat([zlib.gzipSync('ab'), zlib.gzipSync('cd')]), 'gzip');
    assert.equal(r.status, 200, await r.text());
    assert.equal(await sbx.files.read('/tmp/two'), 'abcd');
    await sbx.files.write('/tmp/old', 'old');
    const zipped = zlib.gzipSync(Buffer.from('new '.repeat(1000)));
    for (const bad of [zipped.subarray(0, zipped.length - 4), Buffer.from('not gzip at all'), Buffer.alloc(0), Buffer.concat([zipped, Buffer.from('junk')])]) {
      r = await post('/tmp/old', bad, 'gzip');
      assert.equal(r.status, 400, `${bad.length} bytes`);
      assert.match((await r.json()).message, /gzip/);
      assert.equal(await sbx.files.read('/tmp/old'), 'old');
    }
    r = await post('/tmp/old', 'x', 'br');
    assert.equal(r.status, 415);
    assert.match((await r.json()).message, /gzip and identity/);
  });

  test('several files at once', async () => {
    const infos = await sbx.files.write([{ path: '/tmp/m/1', data: 'one' }, { path: '/tmp/m/2', data: 'two' }]);
    assert.deepEqual(infos.map((i) => i.path), ['/tmp/m/1', '/tmp/m/2']);
    assert.equal(await sbx.files.read('/tmp/m/2'), 'two');
  });

  test('list, exists, getInfo, makeDir, rename, remove', async () => {
    assert.equal(await sbx.files.makeDir('/tmp/tree/a'), true);
    assert.equal(await sbx.files.makeDir('/tmp/tree/a'), false);
    await sbx.files.write('/tmp/tree/a/f.txt', '12345');
    await sbx.commands.run('ln -s a/f.txt /tmp/tree/link');
    const top = await sbx.files.list('/tmp/tree');
    assert.deepEqual(top.map((e) => [e.name, e.type]), [['a', 'dir'], ['link', 'symlink']]);
    const deep = await sbx.files.list('/tmp/tree', { depth: 2 });
    assert.deepEqual(deep.map((e) => e.path), ['/tmp/tree/a', '/tmp/tree/a/f.txt', '/tmp/tree/link']);
    const info = await sbx.files.getInfo('/tmp/tree/a/f.txt');
    assert.equal(info.size, 5);
    assert.equal(info.type, 'file');
    assert.equal(info.owner, 'user');
    assert.match(info.permissions, /^-rw/);
    assert.ok(Math.abs(info.modifiedTime.getTime() - Date.now()) < 60_000);
    assert.equal((await sbx.files.getInfo('/tmp/tree/link')).symlinkTarget, 'a/f.txt');
    assert.equal(await sbx.files.exists('/tmp/tree/a/f.txt'), true);
    assert.equal(await sbx.files.exists('/tmp/tree/nope'), false);
    const moved = await sbx.files.rename('/tmp/tree/a/f.txt', '/tmp/tree/b/g.txt');
    assert.equal(moved.path, '/tmp/tree/b/g.txt');
    assert.equal(await sbx.files.read('/tmp/tree/b/g.txt'), '12345');
    await sbx.files.remove('/tmp/tree');
    assert.equal(await sbx.files.exists('/tmp/tree'), false);
    await assert.rejects(sbx.files.getInfo('/tmp/tree'), e2b.FileNotFoundError);
  });

  test('a missing file is NotFoundError', async () => {
    await assert.rejects(sbx.files.read('/no/such/file'), e2b.FileNotFoundError);
  });

  // Until `events` has one of each [type, name] in `want`.
  async function seen(events, want) {
    const end = Date.now() + 10_000;
    const has = ([type, name]) => events.some((e) => e.type === type && e.name === name);
    while (!want.every(has)) {
      if (Date.now() > end) throw new Error(`missing ${JSON.stringify(want.filter((w) => !has(w)))} in ${JSON.stringify(events)}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  test('watchDir: events as they come, into directories made later, until stopped', async () => {
    await sbx.files.makeDir('watched');
    const events = [];
    const handle = await sbx.files.watchDir('watched', (e) => events.push(e), { recursive: true });
    await sbx.files.write('watched/a.txt', 'one');
    await sbx.commands.run('mkdir watched/sub && sleep 0.2 && echo x > watched/sub/b.txt && chmod 600 watched/a.txt && ' +
      'mv watched/a.txt watched/c.txt && rm watched/c.txt');
    await seen(events, [['create', 'a.txt'], ['write', 'a.txt'], ['create', 'sub'], ['create', 'sub/b.txt'], ['chmod', 'a.txt'],
      ['rename', 'a.txt'], ['create', 'c.txt'], ['remove', 'c.txt']]);
    await handle.stop();
    const count = events.length;
    await sbx.files.write('watched/after.txt', 'unseen');
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(events.length, count, 'an event after stop');
    await assert.rejects(sbx.files.watchDir('no-such-dir', () => {}), e2b.NotFoundError);
  });

  test('a polled watcher: CreateWatcher, GetWatcherEvents, RemoveWatcher', async () => {
    const detail = await (await fetch(`${node.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': node.tenant } })).json();
    const rpc = async (method, body) => {
      const r = await fetch(`${node.url}/filesystem.Filesystem/${method}`, {
        method: 'POST', body: JSON.stringify(body),
        headers: { 'content-type': 'application/json', 'connect-protocol-version': '1', 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': detail.envdAccessToken },
      });
      return { status: r.status, body: await r.json() };
    };
    await sbx.files.makeDir('polled');
    const made = await rpc('CreateWatcher', { path: 'polled' });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    const id = made.body.watcherId;
    assert.match(id, /^w-/);
    await sbx.files.write('polled/x.txt', 'x');
    const events = [];
    const end = Date.now() + 10_000;
    while (!events.some((e) => e.name === 'x.txt' && e.type === 'EVENT_TYPE_WRITE') && Date.now() < end) {
      events.push(...((await rpc('GetWatcherEvents', { watcherId: id })).body.events ?? []));
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(events.some((e) => e.name === 'x.txt' && e.type === 'EVENT_TYPE_CREATE'), JSON.stringify(events));
    assert.equal((await rpc('RemoveWatcher', { watcherId: id })).status, 200);
    const again = await rpc('GetWatcherEvents', { watcherId: id });
    assert.equal(again.status, 404);
    assert.equal(again.body.code, 'not_found');
    assert.equal((await rpc('CreateWatcher', { path: 'polled/../..' })).status, 400);
  });
});

describe('the data plane refuses what it must', () => {
  let sbx;
  before(async () => { sbx = await fresh(); });
  after(async () => { await sbx.kill(); });

  const call = (headers, body = '{}', path = '/process.Process/List', type = 'application/json') =>
    fetch(node.url + path, { method: 'POST', headers: { 'content-type': type, 'connect-protocol-version': '1', ...headers }, body });

  test('no token, a wrong token, an unknown sandbox', async () => {
    assert.equal((await call({ 'E2b-Sandbox-Id': sbx.sandboxId })).status, 401);
    // A wrong token is answered as a sandbox that is not there.
    for (const id of [sbx.sandboxId, 'sb-0000']) {
      const r = await call({ 'E2b-Sandbox-Id': id, 'X-Access-Token': 'x'.repeat(64) });
      assert.equal(r.status, 404);
      assert.equal((await r.json()).code, 'not_found');
    }
    // A streaming call gets it as its stream's end.
    const r = await call({ 'E2b-Sandbox-Id': 'sb-0000', 'X-Access-Token': 'x' }, Buffer.from([0, 0, 0, 0, 2, 123, 125]),
      '/process.Process/Start', 'application/connect+json');
    assert.equal(r.status, 200);
    assert.match(Buffer.from(await r.arrayBuffer()).toString(), /not_found/);
  });

  test('a quiet command\'s stream carries keepalive events as often as asked', async () => {
    const detail = await (await fetch(`${node.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': node.tenant } })).json();
    const json = Buffer.from(JSON.stringify({ process: { cmd: '/bin/sh', args: ['-c', 'sleep 2.5; echo up'] } }));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(json.length, 1);
    const r = await call({ 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': detail.envdAccessToken, 'Keepalive-Ping-Interval': '1' },
      Buffer.concat([head, json]), '/process.Process/Start', 'application/connect+json');
    const body = Buffer.from(await r.arrayBuffer());
    const events = [];
    for (let at = 0; at < body.length;) {
      const n = body.readUInt32BE(at + 1);
      events.push({ flags: body[at], msg: JSON.parse(body.subarray(at + 5, at + 5 + n).toString()) });
      at += 5 + n;
    }
    const kinds = events.map((e) => (e.flags & 2 ? 'end-stream' : Object.keys(e.msg.event)[0]));
    assert.equal(kinds[0], 'start');
    assert.ok(kinds.filter((k) => k === 'keepalive').length >= 2, kinds.join(','));
    assert.deepEqual(kinds.slice(-2), ['end', 'end-stream']);
    assert.ok(kinds.includes('data'));
  });

  test('malformed envelopes, unknown methods, paths with ..', async () => {
    const ok = { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken ?? '' };
    // (the SDK keeps the token private; ask the control plane for it)
    const detail = await (await fetch(`${node.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': node.tenant } })).json();
    ok['X-Access-Token'] = detail.envdAccessToken;
    let r = await call(ok, Buffer.from([0, 0, 0, 0, 99, 1]), '/process.Process/Start', 'application/connect+json');
    assert.equal(r.status, 200);
    assert.match(Buffer.from(await r.arrayBuffer()).subarray(5).toString(), /invalid_argument/);
    r = await call(ok, '{}', '/process.Process/Nope');
    assert.equal((await r.json()).code, 'not_found');
    r = await call(ok, '{"process": 7}');
    assert.equal(r.status, 200);  // (List takes no fields: unknown ones are ignored)
    r = await fetch(`${node.url}/files?path=/tmp/../etc/passwd`, { headers: ok });
    assert.equal(r.status, 400);
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n');
  });
});

describe('over TLS', { skip: throughGateway && 'the node\'s own listener (the gateway run covers the other calls)' }, () => {
  const secure = new Node({ tls: true });
  before(async () => { await secure.start(); });
  after(async () => { await secure.stop(); });

  test('the SDK with its defaults and the node\'s certificate', async () => {
    assert.match(secure.url, /^https:/);
    const { stdout } = await promisify(execFile)(process.execPath, [path.join(import.meta.dirname, 'tls_client.mjs')], {
      env: { ...process.env, NODE_EXTRA_CA_CERTS: secure.cert, E2B_API_URL: secure.url, E2B_SANDBOX_URL: secure.url, E2B_API_KEY: secure.tenant },
    });
    assert.deepEqual(JSON.parse(stdout), { stdout: 'over tls\n', read: 'secret bytes', killed: true });
    assert.equal(secure.sandboxes().length, 0);
  });
});
