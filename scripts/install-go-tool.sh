#!/usr/bin/env bash
# install-go-tool.sh NAME PACKAGE@VERSION: builds a Go tool the tests run
# (cosign, ko) into $(go env GOPATH)/bin, once. Builds take minutes, so
# deps.sh runs this in the background while the tests build and run; the
# tests that need the tool wait for the lock below (sourcestest.GoTool),
# and several runs at once build it once.
set -euo pipefail
name=$1 pkg=$2
gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
exec 9>"$gobin/.$name-install.lock"
flock 9
if command -v "$name" >/dev/null || [ -x "$gobin/$name" ]; then
	exit 0
fi
echo "install-go-tool: building $pkg into $gobin" >&2
GOBIN="$gobin" GOFLAGS=-mod=mod go install "$pkg"
echo "install-go-tool: done" >&2
