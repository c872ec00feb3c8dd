// Command wasmtools serves WebAssembly tool plugins over MCP.
//
//	wasmtools serve [flags] PATH...      serve the plugins in folders or files
//	wasmtools inspect [--json] FILE      show what a plugin is and offers
//	wasmtools call FILE TOOL [ARGS]      call one tool once and print the result
//	wasmtools status [--url URL]         show what a running HTTP server serves
//	wasmtools reload [--url URL]         resolve a running server's remote plugins again
//	wasmtools version                    print the version
//
// Run `wasmtools help` for the flags.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `wasmtools serves WebAssembly tool plugins (Extism ABI) over MCP.

Usage:
  wasmtools serve [flags] PATH|SOURCE...
                                      serve every .wasm in the folders and files given,
                                      and remote plugins (oci://…, https://…)
  wasmtools inspect [--json] FILE     show a plugin's interface, tools, imports, exports, size and sha256
  wasmtools call [flags] FILE TOOL [ARGS_JSON]
                                      call one tool once and print its result
  wasmtools status [--url URL]        show the plugins a running HTTP server serves
  wasmtools reload [--url URL]        make a running HTTP server resolve its remote
                                      plugins again (a moved tag is swapped in)
  wasmtools grants list|revoke        list or revoke the grant answers kept per
                                      subject ([grants] remember_file)
  wasmtools version                   print the version (also --version)
  wasmtools help                      show this help

Run 'wasmtools COMMAND -h' for a command's flags.
`

// run is the whole program, so tests can run it in process: it reads no
// flags or environment but what it is given (lookupEnv may be nil: an
// empty environment).
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) int {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return cmdServe(ctx, args[1:], lookupEnv, stdin, stdout, stderr)
	case "inspect":
		return cmdInspect(ctx, args[1:], lookupEnv, stdout, stderr)
	case "call":
		return cmdCall(ctx, args[1:], lookupEnv, stdin, stdout, stderr)
	case "status":
		return cmdStatus(ctx, args[1:], lookupEnv, stdout, stderr)
	case "reload":
		return cmdReload(ctx, args[1:], lookupEnv, stdout, stderr)
	case "grants":
		return cmdGrants(ctx, args[1:], lookupEnv, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "wasmtools: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// newLogger logs structured text to stderr: stdout may be the MCP stdio
// transport.
func newLogger(stderr io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// defaultCacheDir is where compiled plugins are cached between runs.
func defaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "wasmtools", "compiled")
}
