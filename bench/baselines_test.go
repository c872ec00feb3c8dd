package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/bench/internal/native"
	"github.com/wasmtools/wasmtools/internal/rawkernel"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The raw-wazero baseline (the floor), as in sandbox/bench_test.go: the
// module on plain wazero with the least Extism kernel that runs the
// plugins (package rawkernel: closures over one byte slice with no checks
// beyond Go's), no deadline and no logging.

// rawRuntime is one plugin compiled on plain wazero.
type rawRuntime struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	k        *rawkernel.Kernel // the kernel of calls made with call
	stack    [1]uint64         // their stack (see callOn)
}

// compilationCache returns the on-disk compilation cache the baselines
// share with the test runs (testplugins.CacheDir), so that setting them up
// does not compile the Go plugin again. It only shortens setup: compiling
// is never inside a timed loop, except in BenchmarkCompile, which does not
// use it.
func compilationCache(t testing.TB) wazero.CompilationCache {
	t.Helper()
	cacheOnce.Do(func() {
		cache, cacheErr = wazero.NewCompilationCacheWithDir(testplugins.CacheDir())
	})
	if cacheErr != nil {
		t.Fatal(cacheErr)
	}
	return cache
}

var (
	cacheOnce sync.Once
	cache     wazero.CompilationCache
	cacheErr  error
)

func newRawRuntime(ctx context.Context, t testing.TB, wasm []byte) *rawRuntime {
	t.Helper()
	return newRawRuntimeWith(ctx, t, wasm, wazero.NewRuntimeConfig())
}

// newRawRuntimeWith is newRawRuntime on a runtime of configuration cfg
// (its compilation cache replaced by the shared one).
func newRawRuntimeWith(ctx context.Context, t testing.TB, wasm []byte, cfg wazero.RuntimeConfig) *rawRuntime {
	t.Helper()
	rt := wazero.NewRuntimeWithConfig(ctx, cfg.WithCompilationCache(compilationCache(t)))
	r := &rawRuntime{rt: rt, k: rawkernel.New()}
	t.Cleanup(func() { r.rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, r.rt)
	if err := rawkernel.Define(ctx, r.rt, r.kernel); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.compiled, err = r.rt.CompileModule(ctx, wasm); err != nil {
		t.Fatal(err)
	}
	return r
}

// instantiate makes an instance and runs its initialiser, as wasmtools does.
func (r *rawRuntime) instantiate(ctx context.Context) (api.Module, error) {
	m, err := r.rt.InstantiateModule(ctx, r.compiled, wazero.NewModuleConfig().WithName("").WithStartFunctions().WithRandSource(rand.Reader))
	if err != nil {
		return nil, err
	}
	if f := m.ExportedFunction("_initialize"); f != nil {
		if _, err := f.Call(ctx); err != nil {
			m.Close(ctx)
			return nil, err
		}
	}
	return m, nil
}

// rawKernelKey is the context key of the kernel of a call made with
// callOn; calls made with call use the runtime's own.
type rawKernelKey struct{}

// kernel returns the kernel of the call whose context is ctx.
func (r *rawRuntime) kernel(ctx context.Context) *rawkernel.Kernel {
	if k, ok := ctx.Value(rawKernelKey{}).(*rawkernel.Kernel); ok {
		return k
	}
	return r.k
}

// call runs the export "call" of m with input and returns a copy of the
// output. It looks the export up at each call: for one call on an
// instance; a benchmark's loop of calls takes the export once and uses
// callOn, as a wazero user does (see callOn).
func (r *rawRuntime) call(ctx context.Context, m api.Module, input []byte) ([]byte, error) {
	return r.callOn(ctx, r.k, m.ExportedFunction("call"), r.stack[:], input)
}

// callOn runs f, an instance's export "call", with input on kernel k and
// returns a copy of the output; k need not be the runtime's own, so that
// instances with a kernel each may be called at the same time (ctx must
// then carry k: rawKernelKey). f is kept across calls: each
// ExportedFunction is a new call engine, whose stack is allocated and
// grown afresh by the call (for the Go plugin, about 11 µs and 64 KiB of
// garbage a call), which a floor must not pay and wasmtools does not
// (TestRawCallAllocates). It is called with CallWithStack on stack, the
// caller's room for its result, as wasmtools calls it: Call allocates
// that room at each call. An export that returns non-zero failed, as
// the Extism ABI has it: its call is a *rawGuestError, not its output.
func (r *rawRuntime) callOn(ctx context.Context, k *rawkernel.Kernel, f api.Function, stack []uint64, input []byte) ([]byte, error) {
	k.Reset(input)
	stack[0] = 0
	if err := f.CallWithStack(ctx, stack); err != nil {
		return nil, err
	}
	if rc := uint32(stack[0]); rc != 0 {
		return nil, &rawGuestError{rc: rc, msg: string(k.Error())}
	}
	return append([]byte(nil), k.Output()...), nil
}

// rawGuestError is a call whose export returned rc, not 0, with the
// message the guest set with error_set: the guest's own failure, as
// wasmtools' sandbox.GuestError.
type rawGuestError struct {
	rc  uint32
	msg string
}

func (e *rawGuestError) Error() string { return fmt.Sprintf("call returned %d: %s", e.rc, e.msg) }

// newExtism compiles a plugin with the Extism Go SDK as shipped, WASI
// enabled (the Go plugin needs it), no manifest limits; only the
// compilation cache is set (see compilationCache).
func newExtism(ctx context.Context, t testing.TB, wasm []byte) *extism.CompiledPlugin {
	t.Helper()
	cfg := extism.PluginConfig{EnableWasi: true, RuntimeConfig: wazero.NewRuntimeConfig().WithCompilationCache(compilationCache(t))}
	cp, err := extism.NewCompiledPlugin(ctx, extism.Manifest{Wasm: []extism.Wasm{extism.WasmData{Data: wasm}}}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close(ctx) })
	return cp
}

// extismCall runs the export "call" of an Extism instance.
func extismCall(ctx context.Context, p *extism.Plugin, input []byte) ([]byte, error) {
	rc, out, err := p.CallWithContext(ctx, "call", input)
	if err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, fmt.Errorf("extism: call returned %d", rc)
	}
	return out, nil
}

// newSandbox compiles a plugin with wasmtools' sandbox and default policy,
// and lists its tools once in an instance whose state becomes the
// pre-initialised image, as plugins.Load does: the sandbox as wasmtools
// serves it.
func newSandbox(ctx context.Context, t testing.TB, wasm []byte) *sandbox.Compiled {
	t.Helper()
	return newSandboxWith(ctx, t, wasm, sandbox.Options{})
}

// newSandboxWith is newSandbox with runtime options opts (its CacheDir
// replaced by the shared one).
func newSandboxWith(ctx context.Context, t testing.TB, wasm []byte, opts sandbox.Options) *sandbox.Compiled {
	t.Helper()
	opts.CacheDir = testplugins.CacheDir()
	rt, err := sandbox.NewRuntime(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	inst, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, export := range []string{abi.ExportDescribe, abi.ExportListTools} {
		if c.HasExport(export) {
			if _, err := inst.Call(ctx, export, []byte(`{}`), nil); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	inst.KeepImage()
	inst.Close(ctx)
	return c
}

// resultText decodes a servlet call's output (an MCP CallToolResult) and
// returns its text.
func resultText(out []byte) (string, error) {
	var res struct {
		Content []struct{ Text string } `json:"content"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return "", fmt.Errorf("decode result %q: %w", out, err)
	}
	var parts []string
	for _, c := range res.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n"), nil
}

// TestBaselinesAgree checks that every contender of the benchmarks does the
// same work: each one's first call to each plugin (or to its native twin)
// returns the same text. It keeps the comparisons honest.
func TestBaselinesAgree(t *testing.T) {
	ctx := context.Background()
	bin := nativeServer(t)
	nsrv := native.NewServer()
	for _, p := range benchPlugins {
		wasm := testplugins.Bytes(t, p.path(t))
		h := newHost(t, p.path(t))
		contenders := map[string]func() (string, error){
			"raw-wazero": func() (string, error) {
				r := newRawRuntime(ctx, t, wasm)
				m, err := r.instantiate(ctx)
				if err != nil {
					return "", err
				}
				defer m.Close(ctx)
				out, err := r.call(ctx, m, p.input)
				if err != nil {
					return "", err
				}
				return resultText(out)
			},
			"extism-sdk": func() (string, error) {
				inst, err := newExtism(ctx, t, wasm).Instance(ctx, extism.PluginInstanceConfig{})
				if err != nil {
					return "", err
				}
				defer inst.Close(ctx)
				out, err := extismCall(ctx, inst, p.input)
				if err != nil {
					return "", err
				}
				return resultText(out)
			},
			"wasmtools-sandbox": func() (string, error) {
				inst, err := newSandbox(ctx, t, wasm).Instantiate(ctx)
				if err != nil {
					return "", err
				}
				defer inst.Close(ctx)
				out, err := inst.Call(ctx, "call", p.input, nil)
				if err != nil {
					return "", err
				}
				return resultText(out)
			},
			"wasmtools": func() (string, error) {
				cs, _, err := connectInMemory(ctx, h.Server())
				if err != nil {
					return "", err
				}
				defer cs.Close()
				return callText(ctx, cs, p.tool, p.args)
			},
			"native": func() (string, error) {
				cs, _, err := connectInMemory(ctx, nsrv)
				if err != nil {
					return "", err
				}
				defer cs.Close()
				return callText(ctx, cs, p.tool, p.args)
			},
			"process-per-session": func() (string, error) {
				pr, err := startProcess(ctx, bin)
				if err != nil {
					return "", err
				}
				defer pr.cs.Close()
				return callText(ctx, pr.cs, p.tool, p.args)
			},
		}
		for name, f := range contenders {
			t.Run(p.name+"/"+name, func(t *testing.T) {
				got, err := f()
				if err != nil {
					t.Fatal(err)
				}
				if got != p.want {
					t.Errorf("first call returned %q, want %q", got, p.want)
				}
			})
		}
	}
}
