#!/usr/bin/env bash
# deps.sh: installs the tools that build the non-Go plugins, if missing.
#   wat2wasm (Debian package wabt) builds the WebAssembly-text plugins.
set -euo pipefail
if ! command -v wat2wasm >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "deps: installing wabt (wat2wasm) with apt-get" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wabt >/dev/null
	else
		echo "deps: wat2wasm is missing: install wabt (sudo apt-get install wabt)" >&2
		exit 1
	fi
fi
