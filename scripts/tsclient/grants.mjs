// grants.mjs: the official TypeScript MCP SDK (v2, @modelcontextprotocol/client)
// as the client that answers wasmtools' run-time grant questions. It
// declares form elicitation, answers each question with the next of
// --decisions (a decision such as "allow once", or the actions "decline"
// and "cancel"), and calls the grantask test plugin's tool `fetch` with
// --target N times, passing back the session handle. One JSON line per call
// on stdout: {"call":i,"outcome":"ok"|"denied"|"before"|"dismissed"|"other",
// "text":...,"asked":[messages so far],"protocol":...}.
// Exits 1 on a transport or protocol error, 2 on a usage error.
//
// Usage: node grants.mjs URL --target URL2 [--calls N] [--decisions a,b,...]
//          [--negotiation auto|legacy|VERSION]
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

function usage(msg) {
	if (msg) process.stderr.write(`grants.mjs: ${msg}\n`);
	process.stderr.write('usage: grants.mjs URL --target URL [--calls N] [--decisions a,b] [--negotiation auto|legacy|VERSION]\n');
	process.exit(2);
}

const opts = { calls: 1, decisions: [], negotiation: 'auto', target: null };
let url = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
	const a = argv[i];
	const value = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
	switch (a) {
		case '--target': opts.target = value(); break;
		case '--calls': opts.calls = Number(value()); break;
		case '--decisions': opts.decisions = value().split(','); break;
		case '--negotiation': opts.negotiation = value(); break;
		default:
			if (a.startsWith('-') || url !== null) usage(`unexpected argument ${a}`);
			url = a;
	}
}
if (url === null || opts.target === null) usage('need URL and --target');

const cache = process.env.WASMTOOLS_TSCLIENT_CACHE || path.join(os.homedir(), '.cache', 'wasmtools-tsclient');
const require = createRequire(path.join(cache, 'package.json'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

const mode = opts.negotiation === 'auto' || opts.negotiation === 'legacy' ? opts.negotiation : { pin: opts.negotiation };
const client = new Client({ name: 'wasmtools-tsclient-grants', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode } });
const asked = [];
client.setRequestHandler('elicitation/create', async request => {
	asked.push(request.params.message);
	const d = opts.decisions.shift() ?? 'cancel';
	if (d === 'decline' || d === 'cancel') return { action: d };
	return { action: 'accept', content: { decision: d } };
});
const transport = new StreamableHTTPClientTransport(new URL(url));

async function main() {
	await client.connect(transport);
	const protocol = client.getNegotiatedProtocolVersion() ?? null;
	await client.listTools();
	let handle = null;
	for (let i = 1; i <= opts.calls; i++) {
		const args = { url: opts.target };
		if (handle !== null) args.wasmtools_session = handle;
		const result = await client.callTool({ name: 'fetch', arguments: args });
		const text = (result.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n');
		const got = result._meta?.['dev.wasmtools/session'];
		if (typeof got === 'string') handle = got;
		const outcome = /^200 ok/.test(text) ? 'ok' : /was denied by the person/.test(text) ? 'denied' : /denied earlier in this session/.test(text) ? 'before' : /dismissed the question/.test(text) ? 'dismissed' : 'other';
		process.stdout.write(JSON.stringify({ call: i, outcome, text, asked: [...asked], protocol }) + '\n');
	}
}

let code = 0;
try {
	await main();
} catch (err) {
	process.stderr.write(`grants.mjs: ${err?.stack ?? err}\n`);
	code = 1;
}
try {
	await client.close();
} catch {}
process.exit(code);
