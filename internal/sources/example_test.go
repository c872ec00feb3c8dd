package sources_test

import (
	"fmt"

	"github.com/wasmtools/wasmtools/internal/sources"
)

// A source names a remote plugin; an OCI reference without a tag means
// "latest", as docker and hyper-mcp read it.
func ExampleParse() {
	for _, s := range []string{
		"oci://ghcr.io/tuananh/time-plugin",
		"https://plugins.example.com/fetch.wasm",
		"http://example.com/fetch.wasm",
	} {
		ref, err := sources.Parse(s)
		if err != nil {
			fmt.Println("refused:", err)
			continue
		}
		fmt.Println(ref)
	}
	// Output:
	// oci://ghcr.io/tuananh/time-plugin:latest
	// https://plugins.example.com/fetch.wasm
	// refused: source "http://example.com/fetch.wasm": plain http only on loopback (127.0.0.1, ::1, localhost); use https
}
