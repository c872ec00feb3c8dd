#!/usr/bin/env bash
# install-jaeger.sh: builds Jaeger v1.76.0 (v2, all in one), which the
# tracing test exports to, into $(go env GOPATH)/bin, once. Jaeger's go.mod
# has replace directives, so `go install …@v1.76.0` refuses it: a
# throwaway module takes it as a tool (`go get -tool`) and builds it. It
# takes minutes, so deps.sh runs this in the background; the test waits for
# the lock below (sourcestest.GoTool).
set -euo pipefail
VERSION=v1.76.0
gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
exec 9>"$gobin/.jaeger-install.lock"
flock 9
if command -v jaeger >/dev/null || [ -x "$gobin/jaeger" ]; then
	exit 0
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
echo "install-jaeger: building jaeger $VERSION into $gobin" >&2
go mod init wasmtools.local/jaegertool >/dev/null 2>&1
GOFLAGS=-mod=mod go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$VERSION"
GOFLAGS=-mod=mod go build -o "$gobin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
echo "install-jaeger: done" >&2
