// Command nativeserver is the process-per-session baseline of the
// benchmarks: a small native go-sdk MCP server (the tools of package
// native) serving one client on stdin/stdout and exiting when stdin
// closes. Started once per client, it is how clients are isolated today
// without a Wasm host.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/bench/internal/native"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: nativeserver (serves MCP on stdin/stdout; takes no arguments)")
		return 2
	}
	if err := native.NewServer().Run(ctx, &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(stderr, "nativeserver:", err)
		return 1
	}
	return 0
}
