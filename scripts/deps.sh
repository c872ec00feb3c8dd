#!/usr/bin/env bash
# deps.sh: installs the tools that build the non-Go plugins and that the
# tests run, if missing.
#   wat2wasm (Debian package wabt) builds the WebAssembly-text plugins.
#   /usr/bin/rustc with the wasm32-wasi std (Debian packages rustc and
#   libstd-rust-dev-wasm32) builds the Rust plugins.
#   docker-registry (Debian package docker-registry, distribution v2.8) is
#   the OCI registry the plugin-source tests run on loopback.
#   cosign (go install, into $(go env GOPATH)/bin, where the tests look)
#   signs the plugins those tests push.
set -euo pipefail

# install PKG...: apt-get install as root, else say what to install.
install() {
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "deps: installing $* with apt-get" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
	else
		echo "deps: missing: install $* (sudo apt-get install $*)" >&2
		exit 1
	fi
}

if ! command -v wat2wasm >/dev/null; then
	install wabt
fi

# The std is looked for in rustc's own sysroot, so that a rustc installed
# without it (or another rustc at /usr/bin) is caught here and not in the
# middle of a build.
wasm_std() {
	[ -x /usr/bin/rustc ] || return 1
	local lib
	lib="$(/usr/bin/rustc --print sysroot)/lib/rustlib"
	# wasm32-wasip1 is the target's name from Rust 1.84 on.
	compgen -G "$lib/wasm32-wasi/lib/libstd-*.rlib" >/dev/null || compgen -G "$lib/wasm32-wasip1/lib/libstd-*.rlib" >/dev/null
}
if ! wasm_std; then
	install rustc libstd-rust-dev-wasm32
	wasm_std || { echo "deps: /usr/bin/rustc still has no wasm32-wasi std" >&2; exit 1; }
fi

if ! command -v docker-registry >/dev/null && [ ! -x /usr/bin/docker-registry ]; then
	install docker-registry
fi

# cosign v2.6.5 is the newest v2 that builds with this Go; a build takes a
# few minutes, once per machine.
COSIGN_VERSION=v2.6.5
gobin="$(go env GOPATH)/bin"
if ! command -v cosign >/dev/null && [ ! -x "$gobin/cosign" ]; then
	echo "deps: installing cosign $COSIGN_VERSION with go install (into $gobin)" >&2
	GOBIN="$gobin" GOFLAGS=-mod=mod go install "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION"
fi
