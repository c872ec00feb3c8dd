#!/usr/bin/env bash
# deps.sh: installs the tools that build the non-Go plugins and that the
# tests run, if missing.
#   wat2wasm (Debian package wabt) builds the WebAssembly-text plugins;
#   with --examples, it is all that is installed (the example plugins are
#   Go and WebAssembly text).
#   /usr/bin/rustc with the wasm32-wasi std (Debian packages rustc and
#   libstd-rust-dev-wasm32) builds the Rust plugins.
#   redis-server, haproxy and nginx (Debian packages redis-server, haproxy,
#   nginx-light) are started by the state store's and the proxy configs'
#   tests, each on its own config and loopback port; docker-registry
#   (Debian package docker-registry, distribution v2.8) is the OCI registry
#   the plugin-source tests run on loopback. Their packages' own services
#   are kept from starting (policy-rc.d) and stopped if running: no test
#   relies on them, and nginx's would hold port 80.
#   cosign and ko (go install, into $(go env GOPATH)/bin, where the tests
#   look; scripts/install-go-tool.sh): cosign signs the plugins and the
#   image the tests push, ko builds wasmtools' image (.ko.yaml); jaeger
#   (scripts/install-jaeger.sh) collects the tracing test's spans.
#   zitadel-oidc-example (zitadel/oidc's example OpenID provider, go
#   install, pinned, into $(go env GOPATH)/bin) issues the tokens of the
#   OAuth resource-server tests.
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
# --examples: only what the example plugins need (Go and wat2wasm), for a
# user who wants to serve them, not run the tests (and may not be root).
if [ "${1:-}" = --examples ]; then
	exit 0
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

# install_quiet PKG...: install as above, but with the packages' services
# kept from starting: a policy-rc.d that refuses every start (as Docker
# images have) unless one is there already, removed afterwards.
install_quiet() {
	local policy=/usr/sbin/policy-rc.d ours=
	if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1
	fi
	install "$@" || { [ -z "$ours" ] || rm -f "$policy"; return 1; }
	[ -z "$ours" ] || rm -f "$policy"
	# Where an init did start them anyway, stop them.
	if [ "$(id -u)" = 0 ] && command -v service >/dev/null; then
		local svc
		for svc in redis-server haproxy nginx docker-registry; do
			service "$svc" stop >/dev/null 2>&1 || true
		done
	fi
}

missing=()
command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v docker-registry >/dev/null || [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
if [ ${#missing[@]} -gt 0 ]; then
	install_quiet "${missing[@]}"
fi

# cosign and ko take minutes to build: built in the background (their logs
# beside them), while the plugins and tests build; the tests that need them
# wait (sourcestest.GoTool). ko builds the container image (image test).
gobin="$(go env GOPATH)/bin"
background_go_tool() {
	local name=$1 pkg=$2
	if ! command -v "$name" >/dev/null && [ ! -x "$gobin/$name" ]; then
		mkdir -p "$gobin"
		echo "deps: building $name in the background (log: $gobin/$name-install.log)" >&2
		nohup "$(dirname "$0")/install-go-tool.sh" "$name" "$pkg" >"$gobin/$name-install.log" 2>&1 &
	fi
}
background_go_tool cosign github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5
background_go_tool ko github.com/google/ko@v0.18.0
# Jaeger (the tracing test's collector) needs a module of its own to build.
if ! command -v jaeger >/dev/null && [ ! -x "$gobin/jaeger" ]; then
	mkdir -p "$gobin"
	echo "deps: building jaeger in the background (log: $gobin/jaeger-install.log)" >&2
	nohup "$(dirname "$0")/install-jaeger.sh" >"$gobin/jaeger-install.log" 2>&1 &
fi

# The OAuth tests' OpenID provider (issue 26). Its binary is named
# "server": installed beside, under a name of its own.
if [ ! -x "$gobin/zitadel-oidc-example" ]; then
	mkdir -p "$gobin"
	tmp="$(mktemp -d)"
	echo "deps: installing zitadel/oidc's example OpenID provider" >&2
	GOBIN="$tmp" go install github.com/zitadel/oidc/v3/example/server@v3.52.0
	mv "$tmp/server" "$gobin/zitadel-oidc-example"
	rm -rf "$tmp"
fi
