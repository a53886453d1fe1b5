// scripts/bench e2b: the E2B plane against /v1, on one daemon, from one
// node process. Rows: one command (`true` through E2B's `/bin/bash -l -c`)
// through the e2b SDK, as a raw Connect request, and as a raw /v1 exec of
// the same argv; Sandbox.create -> first command beside /v1 create ->
// exec; 32 sandboxes driven at once both ways. ARGS: CALLS (200) CYCLES (10).
import { performance } from 'node:perf_hooks';

import { Node, requireNpm } from '../e2b/node.mjs';

const CALLS = Number(process.argv[2] ?? 200);
const CYCLES = Number(process.argv[3] ?? 10);
const ARGV = ['/bin/bash', '-l', '-c', 'true'];

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))];
}

async function timed(n, fn) {
  const ms = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn(i);
    ms.push(performance.now() - t);
  }
  return ms;
}

const node = new Node();
try {
  await node.start();
  process.env.E2B_API_URL = node.url;
  process.env.E2B_SANDBOX_URL = node.url;
  process.env.E2B_API_KEY = node.tenant;
  const e2b = requireNpm('e2b');
  const v1 = async (method, path, body) => {
    const r = await fetch(node.url + path, {
      method, headers: { authorization: `Bearer ${node.tenant}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : {};
  };
  const v1exec = (id) => v1('POST', `/v1/sandboxes/${id}/exec`, { argv: ARGV, stream: false });

  const sbx = await e2b.Sandbox.create('base', { timeoutMs: 600_000 });
  const token = (await (await fetch(`${node.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': node.tenant } })).json()).envdAccessToken;
  const envelope = (obj) => {
    const json = Buffer.from(JSON.stringify(obj));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(json.length, 1);
    return Buffer.concat([head, json]);
  };
  const tokenOf = async (id) => (await (await fetch(`${node.url}/sandboxes/${id}`, { headers: { 'X-API-KEY': node.tenant } })).json()).envdAccessToken;
  const rawConnect = async (id = sbx.sandboxId, tok = token) => {
    const r = await fetch(node.url + '/process.Process/Start', {
      method: 'POST',
      headers: { 'content-type': 'application/connect+json', 'connect-protocol-version': '1', 'E2b-Sandbox-Id': id, 'X-Access-Token': tok },
      body: envelope({ process: { cmd: ARGV[0], args: ARGV.slice(1) }, stdin: false }),
    });
    const body = Buffer.from(await r.arrayBuffer());
    if (!body.includes('"exitCode"') && !body.includes('"end"')) throw new Error('no end event: ' + body);
  };
  // Warm up each path.
  for (let i = 0; i < 10; i++) {
    await sbx.commands.run('true');
    await rawConnect();
    await v1exec(sbx.sandboxId);
  }
  // Interleaved so the machine's noise falls on all three alike.
  const sdk = [], raw = [], base = [];
  for (let i = 0; i < CALLS; i++) {
    let t = performance.now(); await sbx.commands.run('true'); sdk.push(performance.now() - t);
    t = performance.now(); await rawConnect(); raw.push(performance.now() - t);
    t = performance.now(); await v1exec(sbx.sandboxId); base.push(performance.now() - t);
  }
  await sbx.kill();

  const e2bCycle = await timed(CYCLES, async () => {
    const s = await e2b.Sandbox.create('base', { timeoutMs: 600_000 });
    await s.commands.run('true');
    await s.kill();
  });
  const v1Cycle = await timed(CYCLES, async () => {
    const s = await v1('POST', '/v1/sandboxes', { layers: ['busybox:1'] });
    await v1exec(s.id);
    await v1('DELETE', `/v1/sandboxes/${s.id}`);
  });

  // 32 sandboxes, each running 10 commands, all at once.
  const many = await Promise.all(Array.from({ length: 32 }, () => e2b.Sandbox.create('base', { timeoutMs: 600_000 })));
  let t = performance.now();
  await Promise.all(many.map(async (s) => { for (let i = 0; i < 10; i++) await s.commands.run('true'); }));
  const e2bRate = 320 / ((performance.now() - t) / 1000);
  t = performance.now();
  await Promise.all(many.map(async (s) => { for (let i = 0; i < 10; i++) await v1exec(s.sandboxId); }));
  const v1Rate = 320 / ((performance.now() - t) / 1000);
  const tokens = await Promise.all(many.map((s) => tokenOf(s.sandboxId)));
  t = performance.now();
  await Promise.all(many.map(async (s, k) => { for (let i = 0; i < 10; i++) await rawConnect(s.sandboxId, tokens[k]); }));
  const rawRate = 320 / ((performance.now() - t) / 1000);
  await Promise.all(many.map((s) => s.kill()));

  const row = (what, ours, theirs, unit = 'ms') =>
    console.log(`| ${what} | ${ours.toFixed(2)} ${unit} | ${theirs.toFixed(2)} ${unit} | ${(ours / theirs).toFixed(2)} |`);
  console.log(`e2b SDK ${requireNpm('e2b/package.json').version} against one daemon, ${CALLS} calls, ${CYCLES} cycles`);
  console.log('| row | E2B plane | /v1 (raw HTTP, same argv) | ratio |');
  console.log('|---|---|---|---|');
  row('commands.run("true") p50', pct(sdk, 50), pct(base, 50));
  row('commands.run("true") p99', pct(sdk, 99), pct(base, 99));
  row('raw Connect Start p50', pct(raw, 50), pct(base, 50));
  row('raw Connect Start p99', pct(raw, 99), pct(base, 99));
  row('create -> first command -> kill p50', pct(e2bCycle, 50), pct(v1Cycle, 50));
  row('32 sandboxes at once, commands/s (SDK)', e2bRate, v1Rate, '/s');
  row('32 sandboxes at once, commands/s (raw Connect)', rawRate, v1Rate, '/s');
  console.log(`E2B plane p50 cost over /v1: SDK ${(pct(sdk, 50) - pct(base, 50)).toFixed(2)} ms, raw Connect ${(pct(raw, 50) - pct(base, 50)).toFixed(2)} ms`);
} finally {
  await node.stop();
}
