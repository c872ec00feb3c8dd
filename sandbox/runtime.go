// Package sandbox runs untrusted Wasm modules that speak the Extism ABI:
// it compiles them, checks what they import, instantiates them with nothing
// granted but what a [Policy] allows, and calls their exports under a
// deadline.
//
// The lifecycle is compile once ([Runtime.Compile] gives a [Compiled]),
// instantiate many times ([Compiled.Instantiate] gives an [Instance]), call
// ([Instance.Call]), and close. Only this package imports wazero.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
)

// Options configures a [Runtime]. The zero value is valid.
type Options struct {
	// CacheDir is where compiled machine code is cached across processes,
	// keyed by wazero version and module bytes. "" means no disk cache:
	// compilation is still shared by the modules of one Runtime.
	CacheDir string
	// Logger receives the runtime's own messages. nil discards them.
	Logger *slog.Logger
}

// Runtime compiles modules. It is safe for concurrent use. Close it after
// every [Compiled] it made.
type Runtime struct {
	cache wazero.CompilationCache
	log   *slog.Logger
}

// NewRuntime returns a Runtime with the given options.
func NewRuntime(opts Options) (*Runtime, error) {
	r := &Runtime{log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("sandbox: compilation cache at %s: %w (choose another directory, or none)", opts.CacheDir, err)
		}
		r.cache = c
	} else {
		r.cache = wazero.NewCompilationCache()
	}
	return r, nil
}

// Close releases the compilation cache. It does not close the Compiled
// modules the Runtime made.
func (r *Runtime) Close(ctx context.Context) error {
	return r.cache.Close(ctx)
}

// Compile validates and compiles wasm under policy p. It fails, without
// running any guest code, when p is not valid ([Policy.Validate]), wasm is
// not a WebAssembly module, does not validate, imports something this host
// does not provide (the error names each), or needs more memory than p
// allows.
//
// Each Compiled has a wazero runtime of its own, since memory limits are a
// runtime setting; machine code is shared through the Runtime's cache.
func (r *Runtime) Compile(ctx context.Context, wasm []byte, p Policy) (*Compiled, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly module (no \\0asm magic number)")
	}
	if wasm[4] != 1 || wasm[5] != 0 || wasm[6] != 0 || wasm[7] != 0 {
		return nil, errors.New("not a WebAssembly core module of version 1 (a component? only core modules are supported)")
	}
	if err := p.network.checkGrants(); err != nil {
		return nil, fmt.Errorf("network grant: %w", err)
	}
	cfg := wazero.NewRuntimeConfig().
		WithCompilationCache(r.cache).
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(p.memoryLimitPages()).
		WithCustomSections(true)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	c, err := newCompiled(ctx, rt, wasm, p)
	if err != nil {
		if cerr := rt.Close(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return c, nil
}

// ModuleInfo is what a module imports and exports, read without checking
// that this host can run it.
type ModuleInfo struct {
	Imports []Func `json:"imports"`
	Exports []Func `json:"exports"`
}

// Inspect reads what wasm imports and exports. Unlike [Runtime.Compile], it
// accepts imports this host does not provide, so that a tool such as
// `wasmtools inspect` can show them.
func (r *Runtime) Inspect(ctx context.Context, wasm []byte) (*ModuleInfo, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly module (no \\0asm magic number)")
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(r.cache))
	defer rt.Close(ctx)
	mod, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	info := &ModuleInfo{Imports: []Func{}, Exports: []Func{}}
	for _, d := range mod.ImportedFunctions() {
		m, n, _ := d.Import()
		info.Imports = append(info.Imports, Func{Module: m, Name: n, Signature: signature(d)})
	}
	for _, d := range mod.ExportedFunctions() {
		info.Exports = append(info.Exports, Func{Name: d.ExportNames()[0], Signature: signature(d)})
	}
	slices.SortFunc(info.Exports, func(a, b Func) int { return strings.Compare(a.Name, b.Name) })
	return info, nil
}
