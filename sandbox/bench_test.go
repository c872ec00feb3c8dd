package sandbox_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmtools/wasmtools/internal/rawkernel"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The baselines here are raw wazero: the same module, instantiated and
// called with the least host code that can run it (an Extism kernel of
// closures over one byte slice, no checks beyond Go's, no timeout, no
// logging). They are the floor wasmtools is measured against.

// rawConfigs are the raw baselines: plain wazero, and wazero with
// close-on-context-done, which compiles a termination check into every
// loop so that a deadline stops a guest that never calls the host: what
// the sandbox used before it compiled in a check of its own
// (interrupt.go). The gap between the two is the price of wazero's check.
func rawConfigs() map[string]wazero.RuntimeConfig {
	return map[string]wazero.RuntimeConfig{
		"raw-wazero":             wazero.NewRuntimeConfig(),
		"raw-wazero-termination": wazero.NewRuntimeConfig().WithCloseOnContextDone(true),
	}
}

func newRawRuntime(ctx context.Context, b testing.TB, k *rawkernel.Kernel) wazero.Runtime {
	return newRawRuntimeCfg(ctx, b, k, wazero.NewRuntimeConfig())
}

// newRawRuntimeCfg is a runtime of configuration cfg with WASI and the
// least Extism kernel (package rawkernel), whose calls use k.
func newRawRuntimeCfg(ctx context.Context, b testing.TB, k *rawkernel.Kernel, cfg wazero.RuntimeConfig) wazero.Runtime {
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	if err := rawkernel.Define(ctx, rt, func(context.Context) *rawkernel.Kernel { return k }); err != nil {
		b.Fatal(err)
	}
	return rt
}

// rawCall runs export with input on a raw instance and returns the output.
func rawCall(ctx context.Context, b testing.TB, k *rawkernel.Kernel, f api.Function, input []byte) []byte {
	k.Reset(input)
	if _, err := f.Call(ctx); err != nil {
		b.Fatal(err)
	}
	return k.Output()
}

func rawInstantiate(ctx context.Context, b testing.TB, rt wazero.Runtime, c wazero.CompiledModule) api.Module {
	m, err := rt.InstantiateModule(ctx, c, wazero.NewModuleConfig().WithName("").WithStartFunctions().WithRandSource(rand.Reader))
	if err != nil {
		b.Fatal(err)
	}
	if f := m.ExportedFunction("_initialize"); f != nil {
		if _, err := f.Call(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return m
}

// benchInput is a 100-byte servlet call input.
var benchInput = func() []byte {
	s := `{"params":{"name":"echo","arguments":{"text":"` + strings.Repeat("x", 50) + `"}}}`
	if len(s) != 100 {
		panic(len(s))
	}
	return []byte(s)
}()

// BenchmarkNewInstanceFirstCall: a new instance of a small (WAT) plugin and
// its first call. Raw wazero is the baseline.
func BenchmarkNewInstanceFirstCall(b *testing.B) {
	ctx := context.Background()
	wasm := testplugins.Bytes(b, testplugins.Example(b, "counter"))
	input := []byte(`{"params":{"name":"count","arguments":{}}}`)
	for name, cfg := range rawConfigs() {
		b.Run(name, func(b *testing.B) {
			k := rawkernel.New()
			rt := newRawRuntimeCfg(ctx, b, k, cfg)
			defer rt.Close(ctx)
			c, _ := rt.CompileModule(ctx, wasm)
			b.ReportAllocs()
			for b.Loop() {
				m := rawInstantiate(ctx, b, rt, c)
				rawCall(ctx, b, k, m.ExportedFunction("call"), input)
				m.Close(ctx)
			}
		})
	}
	b.Run("sandbox", func(b *testing.B) {
		rt, _ := sandbox.NewRuntime(sandbox.Options{})
		c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(ctx)
		b.ReportAllocs()
		for b.Loop() {
			inst, err := c.Instantiate(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := inst.Call(ctx, "call", input, nil); err != nil {
				b.Fatal(err)
			}
			inst.Close(ctx)
		}
	})
}

// BenchmarkInstanceWarmCall: one call with a 100-byte JSON input on a warm instance
// of a Go plugin (the Extism Go PDK's echo). Raw wazero is the baseline.
//
// sandbox-goroutine is sandbox with each call on a goroutine of its own,
// as the go-sdk runs each request: the caller waits for it on a channel.
// sandbox-gc is sandbox in a process that makes, before each call, the
// garbage a go-sdk server and client make per tools/call (sdkGarbage):
// the guest's own time grows with the collector's work beside it, which
// is most of what the Go plugin loses inside the server (docs/DESIGN.md,
// "The Go guest inside the server"). Its ns/op is the calls' time alone,
// not the making of the garbage.
func BenchmarkInstanceWarmCall(b *testing.B) {
	ctx := context.Background()
	wasm := testplugins.Bytes(b, testplugins.Test(b, "servlet"))
	for name, cfg := range rawConfigs() {
		b.Run(name, func(b *testing.B) {
			k := rawkernel.New()
			rt := newRawRuntimeCfg(ctx, b, k, cfg)
			defer rt.Close(ctx)
			c, _ := rt.CompileModule(ctx, wasm)
			m := rawInstantiate(ctx, b, rt, c)
			f := m.ExportedFunction("call")
			b.ReportAllocs()
			for b.Loop() {
				rawCall(ctx, b, k, f, benchInput)
			}
		})
	}
	b.Run("sandbox", func(b *testing.B) {
		inst := warmInstance(ctx, b, wasm)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := inst.Call(ctx, "call", benchInput, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sandbox-goroutine", func(b *testing.B) {
		inst := warmInstance(ctx, b, wasm)
		b.ReportAllocs()
		done := make(chan error)
		for b.Loop() {
			go func() {
				_, err := inst.Call(ctx, "call", benchInput, nil)
				done <- err
			}()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sandbox-gc", func(b *testing.B) {
		inst := warmInstance(ctx, b, wasm)
		var calls time.Duration
		for b.Loop() {
			sdkGarbage()
			start := time.Now()
			if _, err := inst.Call(ctx, "call", benchInput, nil); err != nil {
				b.Fatal(err)
			}
			calls += time.Since(start)
		}
		// The call's time alone: making the garbage is not the guest's.
		b.ReportMetric(float64(calls.Nanoseconds())/float64(b.N), "ns/op")
	})
}

// warmInstance compiles wasm in a sandbox runtime and returns an
// instance of it, closed with the module when b ends.
func warmInstance(ctx context.Context, b *testing.B, wasm []byte) *sandbox.Instance {
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		b.Fatal(err)
	}
	c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(ctx) })
	inst, err := c.Instantiate(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return inst
}

// sdkGarbage allocates what go-sdk v1.8.0 allocates per tools/call over
// the in-memory transport, server and client together (BenchmarkWarmCall
// in bench: about 390 KB in 250 allocations, the native server's and
// wasmtools' alike): mostly the 32 KiB read buffer of the JSON decoder
// that each of its internal json.Unmarshal calls makes, about 12 a call.
func sdkGarbage() {
	for range 12 {
		garbage = make([]byte, 32<<10)
	}
}

var garbage []byte

// BenchmarkInstantiateGo: a new instance of a Go (wasip1) plugin, its
// runtime initialised. Raw wazero is the baseline.
func BenchmarkInstantiateGo(b *testing.B) {
	ctx := context.Background()
	wasm := testplugins.Bytes(b, testplugins.Example(b, "hash"))
	b.Run("raw-wazero", func(b *testing.B) {
		k := rawkernel.New()
		rt := newRawRuntime(ctx, b, k)
		defer rt.Close(ctx)
		c, _ := rt.CompileModule(ctx, wasm)
		for b.Loop() {
			rawInstantiate(ctx, b, rt, c).Close(ctx)
		}
	})
	b.Run("sandbox", func(b *testing.B) {
		rt, _ := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
		c, _ := rt.Compile(ctx, wasm, sandbox.NewPolicy())
		defer c.Close(ctx)
		for b.Loop() {
			inst, err := c.Instantiate(ctx)
			if err != nil {
				b.Fatal(err)
			}
			inst.Close(ctx)
		}
	})
}

// BenchmarkIdleInstanceMemory: RSS per idle instance, with 1,000 live
// instances, reported as KiB/instance (the time per op is meaningless).
func BenchmarkIdleInstanceMemory(b *testing.B) {
	ctx := context.Background()
	const n = 1000
	for _, plugin := range []string{"counter", "hash"} {
		wasm := testplugins.Bytes(b, testplugins.Example(b, plugin))
		b.Run(plugin+"/raw-wazero", func(b *testing.B) {
			k := rawkernel.New()
			rt := newRawRuntime(ctx, b, k)
			defer rt.Close(ctx)
			c, _ := rt.CompileModule(ctx, wasm)
			measureRSS(b, n, func() func() {
				m := rawInstantiate(ctx, b, rt, c)
				return func() { m.Close(ctx) }
			})
		})
		b.Run(plugin+"/sandbox", func(b *testing.B) {
			rt, _ := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
			c, _ := rt.Compile(ctx, wasm, sandbox.NewPolicy())
			defer c.Close(ctx)
			measureRSS(b, n, func() func() {
				inst, err := c.Instantiate(ctx)
				if err != nil {
					b.Fatal(err)
				}
				return func() { inst.Close(ctx) }
			})
		})
	}
}

// measureRSS makes n instances with start, b.N times, and reports the mean
// PSS growth per instance as KiB/instance, and the mean RSS growth as
// RSS-KiB/instance (which counts a shared page of a pre-initialised image
// once per instance mapping it; PSS counts it once).
func measureRSS(b *testing.B, n int, start func() (stop func())) {
	var total, totalRSS int64
	for b.Loop() {
		before, beforeRSS := testplugins.PSS(b), readRSS(b)
		stops := make([]func(), n)
		for i := range stops {
			stops[i] = start()
		}
		total += testplugins.PSS(b) - before
		totalRSS += readRSS(b) - beforeRSS
		for _, stop := range stops {
			stop()
		}
	}
	b.ReportMetric(float64(total)/float64(b.N)/float64(n)/1024, "KiB/instance")
	b.ReportMetric(float64(totalRSS)/float64(b.N)/float64(n)/1024, "RSS-KiB/instance")
}

func readRSS(b *testing.B) int64 { return testplugins.RSS(b) }

// BenchmarkSnapshot: a host-side snapshot of an instance that has
// served a few calls, and its restore into a new instance, for the small
// (WAT) plugin and a Go plugin (the Extism Go PDK servlet); the snapshot's
// size is reported as B/snapshot. snapshot snapshots again an instance
// that did nothing since its last snapshot; snapshot-after-call makes a
// call (untimed) before each snapshot, as a checkpoint does. The raw baselines are the floors each
// stands against: for a snapshot, copying the whole linear memory out of a
// raw wazero instance; for a restore, a new raw wazero instance with its
// initialisation run (what a restore replaces).
func BenchmarkSnapshot(b *testing.B) {
	ctx := context.Background()
	for _, plugin := range []struct{ name, path, input string }{
		{"counter", testplugins.Example(b, "counter"), `{"params":{"name":"count","arguments":{}}}`},
		{"servlet", testplugins.Test(b, "servlet"), `{"params":{"name":"remember","arguments":{"text":"kept"}}}`},
	} {
		wasm := testplugins.Bytes(b, plugin.path)
		input := []byte(plugin.input)
		b.Run(plugin.name+"/raw-wazero-copy", func(b *testing.B) {
			k := rawkernel.New()
			rt := newRawRuntime(ctx, b, k)
			defer rt.Close(ctx)
			c, _ := rt.CompileModule(ctx, wasm)
			m := rawInstantiate(ctx, b, rt, c)
			rawCall(ctx, b, k, m.ExportedFunction("call"), input)
			b.ReportAllocs()
			for b.Loop() {
				mem, _ := m.Memory().Read(0, m.Memory().Size())
				_ = append([]byte(nil), mem...)
			}
		})
		b.Run(plugin.name+"/raw-wazero-new", func(b *testing.B) {
			k := rawkernel.New()
			rt := newRawRuntime(ctx, b, k)
			defer rt.Close(ctx)
			c, _ := rt.CompileModule(ctx, wasm)
			b.ReportAllocs()
			for b.Loop() {
				rawInstantiate(ctx, b, rt, c).Close(ctx)
			}
		})
		rt, _ := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
		c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
		if err != nil {
			b.Fatal(err)
		}
		inst, err := c.Instantiate(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for range 3 {
			if _, err := inst.Call(ctx, "call", input, nil); err != nil {
				b.Fatal(err)
			}
		}
		snap, err := inst.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(plugin.name+"/snapshot", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := inst.Snapshot(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(snap)), "B/snapshot")
		})
		// What a checkpoint does: one more call (untimed), then a
		// snapshot of the instance, whose previous snapshot it has.
		b.Run(plugin.name+"/snapshot-after-call", func(b *testing.B) {
			b.ReportAllocs()
			var last []byte
			for b.Loop() {
				b.StopTimer()
				if _, err := inst.Call(ctx, "call", input, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if last, err = inst.Snapshot(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(last)), "B/snapshot")
		})
		b.Run(plugin.name+"/restore", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fresh, err := c.Restore(ctx, snap)
				if err != nil {
					b.Fatal(err)
				}
				fresh.Close(ctx)
			}
			b.ReportMetric(float64(len(snap)), "B/snapshot")
		})
		inst.Close(ctx)
		c.Close(ctx)
		rt.Close(ctx)
	}
}
