package host

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// benchHost serves one plugin file and returns the host and the named tool.
func benchHost(b testing.TB, path, tool string) (*Host, *plugins.Tool) {
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
		res, err := h.callTool(ctx, key, &plugins.Call{Tool: t, Arguments: args}, nil)
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
func BenchmarkInstanceWarmCall(b *testing.B) {
	b.Run("host-session", benchHostWarmCall)
	b.Run("host-handle", benchHostHandleCall)
}

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
		res, err := h.callTool(ctx, key, &plugins.Call{Tool: t, Arguments: args}, nil)
		if err != nil || res.IsError {
			b.Fatal(err, res)
		}
	}
}

// BenchmarkInstanceWarmCall/host-handle: host-session's call made by a
// 2026-07-28 client with a session handle: the host also splits the
// session argument from the arguments, checks the handle (its HMAC and
// subject), runs the call on the handle's instance and puts the handle in
// the result. Against host-session, what the handle costs the host.
func benchHostHandleCall(b *testing.B) {
	h, t := benchHost(b, testplugins.Test(b, "servlet"), "echo")
	ctx := context.Background()
	ref, err := h.mint("", true)
	if err != nil {
		b.Fatal(err)
	}
	args := json.RawMessage(`{"text":"` + strings.Repeat("x", 50) + `","` + SessionArgument + `":"` + ref.handle + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		rest, presented, err := splitSessionArgument(args)
		if err != nil {
			b.Fatal(err)
		}
		if err := t.ValidateArguments(rest); err != nil {
			b.Fatal(err)
		}
		ref, err := h.handleClient("", presented, true)
		if err != nil || ref.refused != nil {
			b.Fatal(err, ref.refused)
		}
		env := &callEnv{h: h, tool: t, ref: ref}
		res, err := h.callTool(ctx, ref.key, &plugins.Call{Tool: t, Arguments: rest}, env)
		if err != nil || res.IsError || res.Meta[MetaSession] != ref.handle {
			b.Fatal(err, res)
		}
	}
}

// BenchmarkHandleOverhead: what a session handle costs the host on one
// call, without the guest (whose call is hundreds of times longer):
// no-handle is a stateful session's call (the arguments, which name no
// handle, are passed through untouched); handle splits the argument from
// the 100-byte arguments, checks the handle (HMAC, subject, the session
// layer's key) and puts it in the result's _meta.
func BenchmarkHandleOverhead(b *testing.B) {
	h := New(plugins.NewStatic(nil), nil)
	b.Cleanup(func() { h.Close(context.Background()) })
	ref, err := h.mint("alice", true)
	if err != nil {
		b.Fatal(err)
	}
	text := `"text":"` + strings.Repeat("x", 50) + `"`
	b.Run("no-handle", func(b *testing.B) {
		args := json.RawMessage(`{` + text + `}`)
		b.ReportAllocs()
		for b.Loop() {
			rest, presented, err := splitSessionArgument(args)
			if err != nil || presented != "" || len(rest) != len(args) {
				b.Fatal(err)
			}
			h.sessionResult(clientRef{}, "p", &mcp.CallToolResult{})
		}
	})
	b.Run("handle", func(b *testing.B) {
		args := json.RawMessage(`{` + text + `,"` + SessionArgument + `":"` + ref.handle + `"}`)
		b.ReportAllocs()
		for b.Loop() {
			_, presented, err := splitSessionArgument(args)
			if err != nil {
				b.Fatal(err)
			}
			got, err := h.handleClient("alice", presented, true)
			if err != nil || got.key != ref.key {
				b.Fatal(err)
			}
			res := &mcp.CallToolResult{}
			h.sessionResult(got, "p", res)
			if res.Meta[MetaSession] != ref.handle {
				b.Fatal(res.Meta)
			}
		}
	})
}
