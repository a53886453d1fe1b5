// The e2b SDK over HTTPS, in a process of its own (node reads
// NODE_EXTRA_CA_CERTS, the test's certificate, only at its start):
// create, a command, a file both ways, kill. Prints what it saw as JSON.
import { requireNpm } from './node.mjs';

const { Sandbox } = requireNpm('e2b');
const sbx = await Sandbox.create('base', { timeoutMs: 60_000 });
const run = await sbx.commands.run('echo over tls');
await sbx.files.write('/tmp/t.txt', 'secret bytes');
const read = await sbx.files.read('/tmp/t.txt');
const killed = await sbx.kill();
console.log(JSON.stringify({ stdout: run.stdout, read, killed }));
