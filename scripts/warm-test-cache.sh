#!/usr/bin/env bash
# warm-test-cache.sh: compiles every plugin the tests load into the tests'
# shared compilation cache (testplugins.CacheDir: $TMPDIR/wasmtools-test-cache)
# with `wasmtools serve --prepare`, built without the race detector.
#
# Why: under -race, wazero compiling a 4 MB Go plugin takes some 20 s of
# CPU, and every test process that loads it before the cache holds it
# (host's, cmd's, plugins', sandbox's, ... running two at a time) compiles
# it again; here it takes 2 s, once. The plugins package's race run took
# 10 min against 2.3 min with a warm cache. Tests of a cold cache make
# caches of their own (t.TempDir()).
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/plugins"
cp examples/plugins/dist/*.wasm "$work/plugins/"
# The test plugins written in Go, Rust and C (the WAT ones compile in
# milliseconds, and some of them are built to fail or spin at load).
for f in internal/testplugins/dist/*.wasm; do
	if [ "$(stat -c %s "$f")" -gt 65536 ]; then
		cp "$f" "$work/plugins/"
	fi
done
# wazero keeps its compiled code in a folder named by its version, which
# it reads from the binary's build information: a test binary has none
# for its dependencies, so its wazero is "dev", and a wasmtools built
# here would fill wazero-v1.12.0-... where no test looks. Built as "dev",
# it fills the tests' folder.
"$go" build -ldflags=-X=github.com/tetratelabs/wazero/internal/version.version=dev -o "$work/wasmtools" ./cmd/wasmtools
# Plugins whose tools collide are refused after they compiled, so the exit
# status is not the point: the cache is.
"$work/wasmtools" serve --prepare --cache-dir "${TMPDIR:-/tmp}/wasmtools-test-cache" "$work/plugins" >/dev/null 2>&1 || true
echo "warm-test-cache: $(ls "$work/plugins" | wc -l) plugins compiled into ${TMPDIR:-/tmp}/wasmtools-test-cache" >&2
