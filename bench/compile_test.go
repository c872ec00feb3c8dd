package bench

import (
	"context"
	"testing"

	extism "github.com/extism/go-sdk"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// BenchmarkCompile measures what a plugin costs before its first session
// (issue 7, item 6), for the small plugin, the Go plugin, and a whole
// server restart.
//
// For small and go, one op compiles the plugin in a new runtime:
//   - cold: wasmtools' sandbox with no compilation cache: wazero compiles
//     the module to machine code and wasmtools checks its imports. The
//     baseline.
//   - disk-cache: the same with a compilation cache folder that a previous
//     run filled (`wasmtools serve --cache-dir`, on by default), which is
//     what a restart costs.
//   - extism-sdk: the Extism Go SDK as shipped, NewCompiledPlugin with no
//     cache (it also compiles its own kernel module).
//
// For restart, one op is a server restart up to ready: a new runtime,
// plugins.LoadAll of the example plugins (counter, hash, notes) and the
// Go test plugin (compile, detect the interface, list and check the
// tools), and host.New; cold without a cache, disk-cache with a warm one.
func BenchmarkCompile(b *testing.B) {
	ctx := context.Background()
	for _, p := range benchPlugins {
		wasm := testplugins.Bytes(b, p.path(b))
		compile := func(b *testing.B, cacheDir string) {
			rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: cacheDir})
			if err != nil {
				b.Fatal(err)
			}
			c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
			if err != nil {
				b.Fatal(err)
			}
			c.Close(ctx)
			rt.Close(ctx)
		}
		b.Run(p.name+"/cold", func(b *testing.B) {
			for b.Loop() {
				compile(b, "")
			}
		})
		b.Run(p.name+"/disk-cache", func(b *testing.B) {
			dir := b.TempDir()
			compile(b, dir) // fill the cache
			for b.Loop() {
				compile(b, dir)
			}
		})
		b.Run(p.name+"/extism-sdk", func(b *testing.B) {
			for b.Loop() {
				cp, err := extism.NewCompiledPlugin(ctx, extism.Manifest{Wasm: []extism.Wasm{extism.WasmData{Data: wasm}}}, extism.PluginConfig{EnableWasi: true}, nil)
				if err != nil {
					b.Fatal(err)
				}
				cp.Close(ctx)
			}
		})
	}
	served := []string{
		testplugins.Example(b, "counter"),
		testplugins.Example(b, "hash"),
		testplugins.Example(b, "notes"),
		testplugins.Test(b, "servlet"),
	}
	restart := func(b *testing.B, cacheDir string) {
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: cacheDir})
		if err != nil {
			b.Fatal(err)
		}
		cat, errs := plugins.LoadAll(ctx, rt, served, nil)
		if len(errs) > 0 {
			b.Fatal(errs)
		}
		h := host.New(plugins.NewStatic(cat), nil)
		h.Close(ctx)
		cat.Close(ctx)
		rt.Close(ctx)
	}
	b.Run("restart/cold", func(b *testing.B) {
		for b.Loop() {
			restart(b, "")
		}
	})
	b.Run("restart/disk-cache", func(b *testing.B) {
		dir := b.TempDir()
		restart(b, dir) // fill the cache
		for b.Loop() {
			restart(b, dir)
		}
	})
}
