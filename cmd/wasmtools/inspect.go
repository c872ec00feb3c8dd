package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// inspection is what `wasmtools inspect --json` prints.
type inspection struct {
	Path      string         `json:"path"`
	Size      int            `json:"size"`
	SHA256    string         `json:"sha256"`
	Interface abi.Interface  `json:"interface,omitempty"`
	Tools     []abi.Tool     `json:"tools"`
	Imports   []sandbox.Func `json:"imports"`
	Exports   []sandbox.Func `json:"exports"`
	// Error is why the host would not serve the plugin, if it would not.
	Error string `json:"error,omitempty"`
}

func cmdInspect(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools inspect [flags] FILE.wasm\n\nShows which plugin interface the plugin speaks, its tools with their\nschemas, its imports and exports, its size and sha256. Exits 1 if the\nhost would not serve it, and says why.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	log := newLogger(stderr, common.verbose)
	if err := common.loadConfig(lookupEnv); err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	rt, err := common.runtime(log)
	if err != nil {
		fmt.Fprintf(stderr, "wasmtools inspect: %v\n", err)
		return 1
	}
	defer rt.Close(context.Background())

	sum := sha256.Sum256(wasm)
	in := inspection{Path: path, Size: len(wasm), SHA256: hex.EncodeToString(sum[:]), Tools: []abi.Tool{}, Imports: []sandbox.Func{}, Exports: []sandbox.Func{}}
	if info, err := rt.Inspect(ctx, wasm); err != nil {
		in.Error = err.Error()
	} else {
		in.Imports, in.Exports = info.Imports, info.Exports
	}
	if in.Error == "" {
		p, err := plugins.Load(ctx, rt, path, wasm, common.optsFor(log)(path))
		if err != nil {
			in.Error = err.Error()
		} else {
			in.Interface = p.Interface()
			for _, t := range p.Tools() {
				d := t.Def
				d.Name = t.Name
				in.Tools = append(in.Tools, d)
			}
			p.Close(ctx)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(in)
	} else {
		printInspection(stdout, in)
	}
	if in.Error != "" {
		return 1
	}
	return 0
}

func printInspection(w io.Writer, in inspection) {
	fmt.Fprintf(w, "plugin:    %s\nsize:      %d bytes\nsha256:    %s\n", in.Path, in.Size, in.SHA256)
	if in.Interface != "" {
		fmt.Fprintf(w, "interface: %s\n", in.Interface)
	}
	if in.Error != "" {
		fmt.Fprintf(w, "error:     %s\n", in.Error)
	}
	fmt.Fprintf(w, "\ntools (%d):\n", len(in.Tools))
	for _, t := range in.Tools {
		fmt.Fprintf(w, "  %s\n", t.Name)
		if t.Description != "" {
			fmt.Fprintf(w, "    %s\n", t.Description)
		}
		var schema any
		if json.Unmarshal(t.InputSchema, &schema) == nil {
			b, _ := json.Marshal(schema)
			fmt.Fprintf(w, "    input: %s\n", b)
		}
	}
	fmt.Fprintf(w, "\nimports (%d):\n", len(in.Imports))
	for _, f := range in.Imports {
		fmt.Fprintf(w, "  %s.%s %s\n", f.Module, f.Name, f.Signature)
	}
	fmt.Fprintf(w, "\nexports (%d):\n", len(in.Exports))
	for _, f := range in.Exports {
		fmt.Fprintf(w, "  %s %s\n", f.Name, f.Signature)
	}
}
