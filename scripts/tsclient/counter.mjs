// counter.mjs: drives `wasmtools serve --http` with the official TypeScript
// MCP SDK (v2, @modelcontextprotocol/client) over streamable HTTP: lists the
// tools, then calls the counter plugin's tool `count` N times, passing the
// session handle of each result (_meta["dev.wasmtools/session"]) back as the
// next call's argument `wasmtools_session`. One JSON line per call on stdout:
//   {"call":i,"text":...,"isError":bool,"handle":string|null,"protocol":...}
// Exits 1 on a transport or protocol error, 2 on a usage error.
//
// Usage: node counter.mjs URL [--token T] [--calls N] [--no-handle]
//          [--handle H] [--tool NAME] [--negotiation auto|legacy|VERSION]
//          [--read URI] [--trace]
//   --read: after the calls, read the resource URI (the SDK validates the
//     result) and print {"read":URI,"contents":[...]}.
//   --negotiation: the SDK's ClientOptions.versionNegotiation. The SDK's
//     default is 'legacy' (2025 initialize only), so this script opts in with
//     'auto' (probe server/discover, fall back to initialize); a version such
//     as 2026-07-28 pins it (no fallback).
//   --trace: log each HTTP request's MCP headers to stderr.
// The SDK is loaded from $WASMTOOLS_TSCLIENT_CACHE (scripts/tsclient.sh
// installs it there; default ~/.cache/wasmtools-tsclient).
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

const HANDLE_META = 'dev.wasmtools/session';
const HANDLE_ARG = 'wasmtools_session';

function usage(msg) {
	if (msg) process.stderr.write(`counter.mjs: ${msg}\n`);
	process.stderr.write('usage: counter.mjs URL [--token T] [--calls N] [--no-handle] [--handle H] [--tool NAME] [--negotiation auto|legacy|VERSION] [--read URI] [--trace]\n');
	process.exit(2);
}

const opts = { calls: 3, tool: 'count', negotiation: 'auto', passHandle: true, handle: null, token: null, trace: false, read: null };
let url = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
	const a = argv[i];
	const value = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
	switch (a) {
		case '--token': opts.token = value(); break;
		case '--calls': opts.calls = Number(value()); break;
		case '--no-handle': opts.passHandle = false; break;
		case '--handle': opts.handle = value(); break;
		case '--tool': opts.tool = value(); break;
		case '--negotiation': opts.negotiation = value(); break;
		case '--trace': opts.trace = true; break;
		case '--read': opts.read = value(); break;
		case '-h': case '--help': usage(); break;
		default:
			if (a.startsWith('-') || url !== null) usage(`unexpected argument ${a}`);
			url = a;
	}
}
if (url === null) usage('no URL');
if (!Number.isInteger(opts.calls) || opts.calls < 0) usage('--calls takes a whole number');
if (!opts.passHandle) opts.handle = null;

const cache = process.env.WASMTOOLS_TSCLIENT_CACHE || path.join(os.homedir(), '.cache', 'wasmtools-tsclient');
const require = createRequire(path.join(cache, 'package.json'));
let sdk;
try {
	sdk = require('@modelcontextprotocol/client');
} catch (err) {
	process.stderr.write(`counter.mjs: cannot load @modelcontextprotocol/client from ${cache} (run scripts/tsclient.sh): ${err.message}\n`);
	process.exit(2);
}
const { Client, StreamableHTTPClientTransport } = sdk;

const mode = opts.negotiation === 'auto' || opts.negotiation === 'legacy' ? opts.negotiation : { pin: opts.negotiation };

// The transport's own options; only what the flags ask for is set.
const transportOpts = {};
if (opts.token !== null) transportOpts.authProvider = { token: async () => opts.token };
if (opts.trace) {
	transportOpts.fetch = async (input, init) => {
		const h = new Headers(init?.headers);
		const shown = [...h].filter(([k]) => k.startsWith('mcp-') || k === 'authorization').map(([k, v]) => `${k}: ${k === 'authorization' ? v.replace(/ .*/, ' ***') : v}`);
		const res = await fetch(input, init);
		process.stderr.write(`trace: ${init?.method ?? 'GET'} ${input} [${shown.join('; ')}] -> ${res.status}${res.headers.get('mcp-session-id') ? ` mcp-session-id: ${res.headers.get('mcp-session-id')}` : ''}\n`);
		return res;
	};
}

const client = new Client({ name: 'wasmtools-tsclient', version: '1.0.0' }, { versionNegotiation: { mode } });
const transport = new StreamableHTTPClientTransport(new URL(url), transportOpts);

async function main() {
	await client.connect(transport);
	const protocol = client.getNegotiatedProtocolVersion() ?? null;
	const { tools } = await client.listTools();
	const tool = tools.find(t => t.name === opts.tool);
	process.stderr.write(`counter.mjs: protocol ${protocol} (${client.getProtocolEra?.() ?? '?'} era); tools: ${tools.map(t => t.name).join(', ')}\n`);
	if (!tool) throw new Error(`the server has no tool ${opts.tool}`);
	const schemaProp = tool.inputSchema?.properties?.[HANDLE_ARG];
	process.stderr.write(`counter.mjs: ${opts.tool} inputSchema ${HANDLE_ARG}: ${schemaProp ? JSON.stringify(schemaProp) : 'absent'}\n`);

	let handle = opts.handle;
	for (let i = 1; i <= opts.calls; i++) {
		const args = {};
		if (opts.passHandle && handle !== null) args[HANDLE_ARG] = handle;
		const result = await client.callTool({ name: opts.tool, arguments: args });
		const text = result.content?.find(c => c.type === 'text')?.text ?? null;
		const got = result._meta?.[HANDLE_META];
		const resultHandle = typeof got === 'string' ? got : null;
		if (resultHandle !== null) handle = resultHandle;
		process.stdout.write(JSON.stringify({ call: i, text, isError: result.isError === true, handle: resultHandle, protocol }) + '\n');
	}
	if (opts.read !== null) {
		const { contents } = await client.readResource({ uri: opts.read });
		process.stdout.write(JSON.stringify({ read: opts.read, contents, protocol }) + '\n');
	}
}

let code = 0;
try {
	await main();
} catch (err) {
	process.stderr.write(`counter.mjs: ${err?.stack ?? err}\n`);
	code = 1;
}
try {
	await client.close();
} catch {}
process.exit(code);
