#!/usr/bin/env bash
# tsclient-check.sh: the TypeScript SDK (v2, @modelcontextprotocol/client,
# which speaks protocol 2026-07-28) as a client of `wasmtools serve --http`
# serving the counter example, with a shared bearer token and two subjects'
# own tokens ([http.tokens]). Checks that session handles keep each
# client's state (1, 2, 3 on one handle; 1, 2 on another), that the SDK
# mirrors the handle into the Mcp-Param-Wasmtools-Session header, that a
# subject cannot use another's handle, and that two clients of the shared
# token keep their own state; and that the notes example's empty notes://all
# passes the SDK's validation in both eras. scripts/tsclient.sh installs the SDK and Node
# (cached). Prints "tsclient: N passed, M failed" and exits non-zero on a
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK_NAME=tsclient
. scripts/lib/check.sh
GO=${GO:-go}

"$GO" build -o wasmtools ./cmd/wasmtools
plugin=examples/plugins/dist/counter.wasm
[ -f "$plugin" ] || { echo "tsclient: $plugin is not built: run make plugins" >&2; exit 1; }
scripts/tsclient.sh >/dev/null 2>&1 || [ $? -eq 2 ] # install (usage error: no URL)

tmp=$(mktemp -d)
shared=shared-token-$RANDOM$RANDOM$RANDOM
alice=alice-token-$RANDOM$RANDOM$RANDOM
bob=bob-token-$RANDOM$RANDOM$RANDOM
cat >"$tmp/config.toml" <<EOF
[http]
auth_token = "$shared"
tokens = { alice = "$alice", bob = "$bob" }
EOF
notes=examples/plugins/dist/notes.wasm
./wasmtools serve --no-watch --config "$tmp/config.toml" --http 127.0.0.1:0 "$plugin" "$notes" 2>"$tmp/log" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$tmp"' EXIT
url=$(logged_url "$tmp/log")

# texts OUTPUT: the texts of the calls, comma-separated.
texts() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p' <<<"$1" | paste -sd, -; }
# handles OUTPUT: how many different handles the calls got.
handles() { sed -n 's/.*"handle":"\([^"]*\)".*/\1/p' <<<"$1" | sort -u | wc -l; }
run() { scripts/tsclient.sh "$url" "$@" 2>"$tmp/stderr" || true; }

a=$(run --token "$alice" --calls 3 --trace)
check "alice counts 1,2,3 on her handle" '^1,2,3$' "$(texts "$a")"
check "alice: one handle" '^1$' "$(handles "$a")"
check "alice: protocol 2026-07-28" '"protocol":"2026-07-28"' "$a"
check "the SDK sends Mcp-Param-Wasmtools-Session" 'mcp-param-wasmtools-session: wt1\.' "$(cat "$tmp/stderr")"
ah=$(sed -n 's/.*"handle":"\([^"]*\)".*/\1/p' <<<"$a" | head -1)

b=$(run --token "$bob" --calls 2)
check "bob counts 1,2 on his own handle" '^1,2$' "$(texts "$b")"
bh=$(sed -n 's/.*"handle":"\([^"]*\)".*/\1/p' <<<"$b" | head -1)
check "bob's handle is his own" '^own$' "$([ -n "$bh" ] && [ "$bh" != "$ah" ] && echo own || echo "alice's or none: $bh")"

c=$(run --token "$bob" --handle "$ah" --calls 1)
check "bob with alice's handle is refused" '"isError":true' "$c"
check "the refusal says why" 'another client' "$c"
again=$(run --token "$alice" --handle "$ah" --calls 1)
check "alice's state is untouched: 4" '^4$' "$(texts "$again")"

s1=$(run --token "$shared" --calls 3)
s2=$(run --token "$shared" --calls 2)
check "shared token, first client: 1,2,3" '^1,2,3$' "$(texts "$s1")"
check "shared token, second client: 1,2" '^1,2$' "$(texts "$s2")"

# A text resource whose text is empty (no notes yet) is sent with "text": "",
# which the SDK's result schema requires (issue 14).
for negotiation in auto legacy; do
	r=$(run --token "$alice" --calls 0 --negotiation "$negotiation" --read notes://all)
	check "empty notes://all passes the SDK's validation ($negotiation)" '"read":"notes://all","contents":\[\{[^]]*"text":""' "$r"
done

checked
