package host

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// benchHost serves one plugin file and returns the host and the named tool.
func benchHost(b *testing.B, path, tool string) (*Host, *plugins.Tool) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Close(ctx) })
	cat, errs := plugins.LoadAll(ctx, rt, []string{path}, nil)
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	b.Cleanup(func() { cat.Close(ctx) })
	h := New(plugins.NewStatic(cat), nil)
	b.Cleanup(func() { h.Close(ctx) })
	t, ok := cat.Tool(tool)
	if !ok {
		b.Fatalf("no tool %s", tool)
	}
	return h, t
}

// BenchmarkNewInstanceFirstCall/host-session: a new session's first call
// to a small (WAT) plugin, host side (session, slot, limits, instance,
// call, result), without the MCP transport; the session is ended after
// each. Its baselines are sandbox's BenchmarkNewInstanceFirstCall/raw-*,
// which `make bench` runs beside it.
func BenchmarkNewInstanceFirstCall(b *testing.B) { b.Run("host-session", benchHostFirstCall) }

func benchHostFirstCall(b *testing.B) {
	h, t := benchHost(b, testplugins.Example(b, "counter"), "count")
	ctx := context.Background()
	args := json.RawMessage(`{}`)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		key := sessions.Client(strconv.Itoa(i))
		if err := t.ValidateArguments(args); err != nil {
			b.Fatal(err)
		}
		res, err := h.callTool(ctx, key, plugins.Call{Tool: t, Arguments: args}, nil)
		if err != nil || res.IsError {
			b.Fatal(err, res)
		}
		h.ses.End(ctx, key)
	}
}

// BenchmarkInstanceWarmCall/host-session: a session's call to its warm
// instance of a Go plugin (the Extism Go PDK's echo) with a 100-byte JSON
// input, host side including argument validation and result shaping,
// without the MCP transport. Its baselines are sandbox's
// BenchmarkInstanceWarmCall/raw-*.
func BenchmarkInstanceWarmCall(b *testing.B) { b.Run("host-session", benchHostWarmCall) }

func benchHostWarmCall(b *testing.B) {
	h, t := benchHost(b, testplugins.Test(b, "servlet"), "echo")
	ctx := context.Background()
	args := json.RawMessage(`{"text":"` + strings.Repeat("x", 50) + `"}`)
	key := sessions.Client("bench")
	b.ReportAllocs()
	for b.Loop() {
		if err := t.ValidateArguments(args); err != nil {
			b.Fatal(err)
		}
		res, err := h.callTool(ctx, key, plugins.Call{Tool: t, Arguments: args}, nil)
		if err != nil || res.IsError {
			b.Fatal(err, res)
		}
	}
}
