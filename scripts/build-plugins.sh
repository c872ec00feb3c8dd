#!/usr/bin/env bash
# build-plugins.sh SRC OUT: builds every plugin folder in SRC into OUT/NAME.wasm.
#   a folder with Go files:   GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared
#   a folder with NAME.wat:   wat2wasm (Debian package wabt)
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
	else
		echo "build-plugins: $dir: nothing to build (no Go files, no $name.wat)" >&2
		exit 1
	fi
	echo "built $out/$name.wasm" >&2
done
