#!/usr/bin/env bash
# install-cosign.sh: builds cosign, which the plugin-source tests sign
# with, into $(go env GOPATH)/bin, once. The build takes minutes, so
# deps.sh runs this in the background while the tests build and run; the
# tests that need cosign wait for the lock below (sourcestest.Cosign), and
# several runs at once build it once.
set -euo pipefail
VERSION=v2.6.5 # the newest v2 that builds with this Go
gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
exec 9>"$gobin/.cosign-install.lock"
flock 9
if command -v cosign >/dev/null || [ -x "$gobin/cosign" ]; then
	exit 0
fi
echo "install-cosign: building cosign $VERSION into $gobin" >&2
GOBIN="$gobin" GOFLAGS=-mod=mod go install "github.com/sigstore/cosign/v2/cmd/cosign@$VERSION"
echo "install-cosign: done" >&2
