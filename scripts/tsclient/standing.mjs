// standing.mjs: a 2025-11-25 session of the official TypeScript MCP SDK
// (v2, @modelcontextprotocol/client) whose standing GET stream is ended
// many times, against `wasmtools serve --http` watching a plugin folder.
// The script puts a proxy of its own between the SDK and the server that
// ends each standing stream right after its first event (the host's
// priming event), --drops times, as a draining replica or a proxy's
// timeout does; --refuse K makes it then answer the next K standing GETs
// with 503 instead (as a proxy with no replica to send them to does).
// Then it copies --add SRC to --as DST (a plugin the server does not
// serve yet, in the folder it watches), waits up to --wait seconds for notifications/tools/list_changed,
// and calls the counter's tool `count` on the same session.
// One JSON line per event on stdout:
//   {"get":i,"lastEventId":...,"afterMs":ms since the last stream ended}
//   {"gaveUp":message}     the SDK stopped reopening the stream
//   {"notified":bool,"gets":n,"session":id,"count":text}
// Exits 1 on a transport or protocol error, 2 on a usage error.
//
// Usage: node standing.mjs URL --add SRC --as DST [--drops N] [--refuse K] [--wait S]
import { createRequire } from 'node:module';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

function usage(msg) {
	if (msg) process.stderr.write(`standing.mjs: ${msg}\n`);
	process.stderr.write('usage: standing.mjs URL --add SRC --as DST [--drops N] [--refuse K] [--wait S]\n');
	process.exit(2);
}

let url, opts;
try {
	const { values, positionals } = parseArgs({
		allowPositionals: true,
		options: { drops: { type: 'string', default: '8' }, refuse: { type: 'string', default: '0' }, wait: { type: 'string', default: '20' }, add: { type: 'string' }, as: { type: 'string' } },
	});
	if (positionals.length !== 1) usage('one URL');
	url = positionals[0];
	opts = { drops: Number(values.drops), refuse: Number(values.refuse), wait: Number(values.wait), add: values.add, as: values.as };
} catch (err) {
	usage(err.message);
}
if (!opts.add || !opts.as) usage('no --add SRC --as DST');
for (const k of ['drops', 'refuse', 'wait']) if (!Number.isInteger(opts[k]) || opts[k] < 0) usage(`--${k} takes a whole number`);

const cache = process.env.WASMTOOLS_TSCLIENT_CACHE || path.join(os.homedir(), '.cache', 'wasmtools-tsclient');
const require = createRequire(path.join(cache, 'package.json'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

const out = o => process.stdout.write(JSON.stringify(o) + '\n');
const upstream = new URL(url);

// The proxy. Standing GETs are counted; the last one is kept open.
let gets = 0, lastEnd = null;
let opened; // resolves when a standing stream is passed through for good
const openedForGood = new Promise(r => { opened = r; });
const proxy = http.createServer((req, res) => {
	const standing = req.method === 'GET';
	let end = 'pass';
	if (standing) {
		gets++;
		out({ get: gets, lastEventId: req.headers['last-event-id'] ?? null, afterMs: lastEnd === null ? null : Date.now() - lastEnd });
		if (gets > opts.drops && gets <= opts.drops + opts.refuse) {
			lastEnd = Date.now();
			res.writeHead(503, { 'Content-Type': 'text/plain' }).end('no replica\n');
			return;
		}
		end = gets <= opts.drops ? 'afterFirstEvent' : 'never';
	}
	const up = http.request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, ur => {
		res.writeHead(ur.statusCode, ur.headers);
		if (!standing || ur.statusCode !== 200) {
			ur.pipe(res);
			return;
		}
		if (end === 'never') opened();
		let seen = '';
		ur.on('data', chunk => {
			if (res.writableEnded) return;
			res.write(chunk);
			seen += chunk;
			if (end === 'afterFirstEvent' && seen.includes('\n\n')) {
				lastEnd = Date.now();
				ur.destroy();
				res.end();
			}
		});
		ur.on('end', () => res.end());
		ur.on('error', () => res.end());
	});
	up.on('error', err => res.writeHead(502).end(String(err)));
	req.pipe(up);
});
await new Promise(r => proxy.listen(0, '127.0.0.1', r));
const proxied = new URL(upstream.pathname, `http://127.0.0.1:${proxy.address().port}`);

let notified;
const listChanged = new Promise(r => { notified = r; });
const client = new Client({ name: 'wasmtools-tsclient-standing', version: '1.0.0' }, { versionNegotiation: { mode: 'legacy' } });
client.setNotificationHandler('notifications/tools/list_changed', () => notified(true));
const transport = new StreamableHTTPClientTransport(proxied);
let gaveUp = false;
const onerror = err => {
	if (!gaveUp && /Maximum reconnection attempts/.test(err?.message)) {
		gaveUp = true;
		out({ gaveUp: err.message });
		opened(); // nothing more to wait for
	}
};
transport.onerror = onerror; // the Client chains it, or replaces it: both
client.onerror = onerror;

let code = 0;
try {
	await client.connect(transport);
	const first = await client.callTool({ name: 'count', arguments: {} });
	await openedForGood;
	fs.copyFileSync(opts.add, opts.as);
	const got = await Promise.race([listChanged, new Promise(r => setTimeout(() => r(false), opts.wait * 1000))]);
	const result = await client.callTool({ name: 'count', arguments: {} });
	const text = r => r.content?.find(c => c.type === 'text')?.text ?? null;
	out({ notified: got, gets, session: transport.sessionId ?? null, count: [text(first), text(result)].join(',') });
} catch (err) {
	process.stderr.write(`standing.mjs: ${err?.stack ?? err}\n`);
	code = 1;
}
await transport.close().catch(() => {});
proxy.close();
proxy.closeAllConnections();
process.exit(code);
