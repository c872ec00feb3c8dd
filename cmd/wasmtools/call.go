package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

func cmdCall(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var common commonFlags
	common.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: wasmtools call [flags] FILE.wasm TOOL [ARGUMENTS_JSON]\n\nCalls one tool of a plugin once, in a fresh instance with the same\nsandbox as `serve`, and prints the result as JSON. The arguments are\nchecked against the tool's input schema first. Exits 1 if the result is\nan error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() < 2 || fs.NArg() > 3 {
		fs.Usage()
		return 2
	}
	path, toolName := fs.Arg(0), fs.Arg(1)
	argsJSON := json.RawMessage(`{}`)
	if fs.NArg() == 3 {
		argsJSON = json.RawMessage(fs.Arg(2))
	}
	log := newLogger(stderr, common.verbose)
	if err := common.loadConfig(lookupEnv); err != nil {
		fmt.Fprintf(stderr, "wasmtools call: %v\n", err)
		return 1
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "wasmtools call: %v\n", err)
		return 1
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	rt, err := common.runtime(log)
	if err != nil {
		return fail(err)
	}
	defer rt.Close(context.Background())
	p, err := plugins.Load(ctx, rt, path, wasm, common.optsFor(log)(path))
	if err != nil {
		return fail(err)
	}
	defer p.Close(context.Background())
	var tool *plugins.Tool
	var names []string
	for _, t := range p.Tools() {
		names = append(names, t.Name)
		if t.Name == toolName {
			tool = t
		}
	}
	if tool == nil {
		return fail(fmt.Errorf("plugin %q has no tool %q; it has %v", p.Name(), toolName, names))
	}
	if err := tool.ValidateArguments(argsJSON); err != nil {
		return fail(err)
	}
	inst, err := p.NewInstance(ctx)
	if err != nil {
		return fail(err)
	}
	defer inst.Close(context.Background())
	res, err := inst.CallTool(ctx, plugins.Call{Tool: tool, Arguments: argsJSON})
	if err != nil {
		var ge *sandbox.GuestError
		if errors.As(err, &ge) {
			return fail(fmt.Errorf("tool %q failed: %s", toolName, ge.Message))
		}
		return fail(err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return fail(err)
	}
	if res.IsError {
		return 1
	}
	return 0
}
