#!/usr/bin/env bash
# deps.sh: installs the tools that build the non-Go plugins, if missing.
#   wat2wasm (Debian package wabt) builds the WebAssembly-text plugins.
#   /usr/bin/rustc with the wasm32-wasi std (Debian packages rustc and
#   libstd-rust-dev-wasm32) builds the Rust plugins.
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
