#!/usr/bin/env bash
# build-plugins.sh SRC OUT: builds every plugin folder in SRC into OUT/NAME.wasm.
#   a folder with Go files:   GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared
#   a folder with NAME.wat:   wat2wasm (Debian package wabt)
#   a folder with NAME.rs:    Debian's rustc (packages rustc and libstd-rust-dev-wasm32),
#                             one file, std only, no Cargo: nothing to fetch
set -euo pipefail
src=$1 out=$2
mkdir -p "$out"
for dir in "$src"/*/; do
	name=$(basename "$dir")
	[ "$name" = dist ] && continue
	if compgen -G "$dir*.go" >/dev/null; then
		GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o "$out/$name.wasm" "./$dir"
	elif [ -f "$dir$name.wat" ]; then
		command -v wat2wasm >/dev/null || { echo "wat2wasm not found: apt-get install wabt" >&2; exit 1; }
		wat2wasm "$dir$name.wat" -o "$out/$name.wasm"
	elif [ -f "$dir$name.rs" ]; then
		# /usr/bin/rustc, not the first on PATH: a rustup rustc (~/.cargo/bin)
		# usually lacks the wasm32-wasi std, which Debian's packages provide.
		[ -x /usr/bin/rustc ] || { echo "/usr/bin/rustc not found: apt-get install rustc libstd-rust-dev-wasm32" >&2; exit 1; }
		# Rust 1.84 renamed the target wasm32-wasi to wasm32-wasip1.
		target=wasm32-wasi
		[ -d "$(/usr/bin/rustc --print sysroot)/lib/rustlib/wasm32-wasip1" ] && target=wasm32-wasip1
		/usr/bin/rustc --target $target --crate-type cdylib -O -C strip=debuginfo "$dir$name.rs" -o "$out/$name.wasm"
	else
		echo "build-plugins: $dir: nothing to build (no Go files, no $name.wat, no $name.rs)" >&2
		exit 1
	fi
	echo "built $out/$name.wasm" >&2
done
