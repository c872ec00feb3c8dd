// oauth.mjs: the official TypeScript MCP SDK (v2, @modelcontextprotocol/client)
// discovering wasmtools as an OAuth 2.1 resource server, the way its
// auth flow does before it asks a person to sign in: an unauthenticated
// request gets 401 with WWW-Authenticate naming the protected resource
// metadata (RFC 9728); the SDK reads that document (from the header's URL
// and by the path-aware well-known URL), and then the authorization
// server's metadata (RFC 8414 / OpenID discovery) it names. Prints one
// JSON object on stdout with what it found; exits 1 on an error.
//
// Usage: node oauth.mjs URL
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

const url = process.argv[2];
if (!url) {
	process.stderr.write('usage: oauth.mjs URL\n');
	process.exit(2);
}
const cache = process.env.WASMTOOLS_TSCLIENT_CACHE || path.join(os.homedir(), '.cache', 'wasmtools-tsclient');
const require = createRequire(path.join(cache, 'package.json'));
const sdk = require('@modelcontextprotocol/client');

async function main() {
	const out = {};
	// What the SDK's transport sends first: an initialize, without a token.
	const res = await fetch(url, {
		method: 'POST',
		headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
		body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'oauth.mjs', version: '1' } } }),
	});
	out.status = res.status;
	const params = sdk.extractWWWAuthenticateParams(res);
	out.resourceMetadataUrl = params.resourceMetadataUrl?.href ?? null;
	out.error = params.error ?? null;
	// From the header's URL, as the SDK's auth() does.
	const fromHeader = await sdk.discoverOAuthProtectedResourceMetadata(url, { resourceMetadataUrl: params.resourceMetadataUrl });
	out.resource = fromHeader.resource;
	out.authorizationServers = fromHeader.authorization_servers;
	out.scopesSupported = fromHeader.scopes_supported ?? null;
	// Without the header: the path-aware well-known URL (RFC 9728 §3.1).
	const byPath = await sdk.discoverOAuthProtectedResourceMetadata(url);
	out.samePathDocument = JSON.stringify(byPath) === JSON.stringify(fromHeader);
	// The authorization server it names.
	const as = await sdk.discoverAuthorizationServerMetadata(fromHeader.authorization_servers[0]);
	out.issuer = as?.issuer ?? null;
	out.tokenEndpoint = as?.token_endpoint ?? null;
	process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch(err => {
	process.stderr.write(`oauth.mjs: ${err?.stack || err}\n`);
	process.exit(1);
});
