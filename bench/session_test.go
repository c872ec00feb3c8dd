package bench

import (
	"context"
	"testing"

	extism "github.com/extism/go-sdk"

	"github.com/wasmtools/wasmtools/bench/internal/native"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// BenchmarkSessionStart measures what a new client costs before it gets
// its first answer (issue 7, item 1): a new session's first call to a
// small plugin (small: the 600-byte WAT counter) and to a Go plugin (go:
// the servlet test plugin, Extism Go PDK, a 100-byte input), then its end.
// The time per op is one whole session.
//
// Contenders, from the floor up:
//   - raw-wazero: instantiate on plain wazero, run the initialiser, call,
//     close. The floor: no MCP, no checks, no deadline.
//   - extism-sdk: the Extism Go SDK as shipped: CompiledPlugin.Instance,
//     Call("call"), Close. No MCP.
//   - wasmtools-sandbox: wasmtools' sandbox alone: Instantiate, Call,
//     Close. No MCP; compare with the two above.
//   - native: a new go-sdk client session over the in-memory transport to
//     a go-sdk server with the tool as a native Go handler, one tools/call,
//     close. MCP's own cost of a session, with no isolation.
//   - wasmtools: the same, to wasmtools serving the plugin: the host makes
//     the session's instance on its first call and frees it when the
//     session ends.
//   - process-per-session: start the native server binary, connect over
//     stdio, one tools/call, close stdin and wait for the process to exit.
//     What clients are isolated with today.
//
// The report gives ratios to raw-wazero and to process-per-session.
func BenchmarkSessionStart(b *testing.B) {
	ctx := context.Background()
	bin := nativeServer(b)
	nsrv := native.NewServer()
	for _, p := range benchPlugins {
		wasm := testplugins.Bytes(b, p.path(b))
		b.Run(p.name+"/raw-wazero", func(b *testing.B) {
			r := newRawRuntime(ctx, b, wasm)
			for b.Loop() {
				m, err := r.instantiate(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := r.call(ctx, m, p.input); err != nil {
					b.Fatal(err)
				}
				m.Close(ctx)
			}
		})
		b.Run(p.name+"/extism-sdk", func(b *testing.B) {
			cp := newExtism(ctx, b, wasm)
			for b.Loop() {
				inst, err := cp.Instance(ctx, extism.PluginInstanceConfig{})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := extismCall(ctx, inst, p.input); err != nil {
					b.Fatal(err)
				}
				inst.Close(ctx)
			}
		})
		b.Run(p.name+"/wasmtools-sandbox", func(b *testing.B) {
			c := newSandbox(ctx, b, wasm)
			for b.Loop() {
				inst, err := c.Instantiate(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := inst.Call(ctx, "call", p.input, nil); err != nil {
					b.Fatal(err)
				}
				inst.Close(ctx)
			}
		})
		b.Run(p.name+"/native", func(b *testing.B) {
			for b.Loop() {
				cs, ss, err := connectInMemory(ctx, nsrv)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
					b.Fatal(err)
				}
				cs.Close()
				ss.Wait()
			}
		})
		b.Run(p.name+"/wasmtools", func(b *testing.B) {
			h := newHost(b, p.path(b))
			for b.Loop() {
				cs, ss, err := connectInMemory(ctx, h.Server())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
					b.Fatal(err)
				}
				cs.Close()
				ss.Wait()
			}
		})
		b.Run(p.name+"/process-per-session", func(b *testing.B) {
			for b.Loop() {
				pr, err := startProcess(ctx, bin)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := callText(ctx, pr.cs, p.tool, p.args); err != nil {
					b.Fatal(err)
				}
				if err := pr.cs.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
