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
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
)

// Options configures a [Runtime]. The zero value is valid.
type Options struct {
	// CacheDir is where compiled machine code is cached across processes,
	// keyed by wazero version, module bytes and the CPU's features, and
	// beside it what the check and the rewriting made of each module
	// (checked.go), keyed by module, limits, interruption and this
	// package's sources. "" means no disk cache: compilation is still
	// shared by the modules of one Runtime. A cache that cannot be read
	// or written (a full or read-only volume) is skipped for a minute at
	// a time, with a warning: compiling costs time, never a plugin (see
	// [Runtime.DiskCacheError]).
	CacheDir string
	// CheckedCacheBytes bounds the bytes of this build's entries of
	// CacheDir's checked-module cache, CompiledCacheBytes those of
	// wazero's folder of machine code in it: past a bound, what was used
	// least recently goes. 0 means the default (1 GiB, 2 GiB); a negative
	// bound is an error.
	CheckedCacheBytes, CompiledCacheBytes int64
	// Logger receives the runtime's own messages. nil discards them.
	Logger *slog.Logger
	// Interruption is how a guest is stopped at its call's deadline or
	// cancellation; the zero value, [InterruptFlag], instruments each
	// module with a host-set flag. [InterruptWazero] is the fallback.
	Interruption Interruption
}

// Runtime compiles modules. It is safe for concurrent use. Close it after
// every [Compiled] it made.
type Runtime struct {
	cache wazero.CompilationCache
	// cacheDir is the disk cache's folder (absolute), "" for none.
	// memCache compiles while the disk cache cannot be written (a full
	// or read-only volume): a cache exists to make starts faster, and
	// must never be why a plugin is not served. diskOffUntil (Unix
	// nanoseconds) is when the disk cache is tried again.
	cacheDir     string
	memCache     wazero.CompilationCache
	diskOffUntil atomic.Int64
	diskErr      atomic.Pointer[error]
	log          *slog.Logger
	interrupt    Interruption
	// overrun counts compilations that passed their deadline and are
	// still running in the background (see compileModule).
	overrun atomic.Int32
	// inflight counts compilations running, for Close; running is
	// their number.
	inflight sync.WaitGroup
	running  atomic.Int32
	// checkedOnce starts the sweep of the checked-module cache, once;
	// sweeping counts it while it runs, for Close (checked.go).
	checkedOnce sync.Once
	sweeping    sync.WaitGroup
	// sweepHook, if set (by a test), is called as the sweep begins.
	sweepHook func()
	// checkedBound bounds the bytes of this build's checked-module
	// entries (Options.CheckedCacheBytes, else checkedMaxBytes;
	// checked.go). checkedReading counts, by
	// key, this runtime's reads of entries under way, which evictChecked
	// passes over; checkedMu guards it.
	checkedBound   int64
	checkedMu      sync.Mutex
	checkedReading map[string]int
	// checkedReadHook, if set (by a test), is called as an entry is
	// read, its file open.
	checkedReadHook func()
	// compiledBound bounds the bytes of wazero's folder of machine code
	// (Options.CompiledCacheBytes, else compiledMaxBytes;
	// wazero_cache.go). evicting says an eviction
	// runs, evictAgain that it runs once more; evictMu guards both.
	compiledBound        int64
	evictMu              sync.Mutex
	evicting, evictAgain bool
	// compiling serialises the compilations of identical bytes: a lock
	// (a 1-slot channel, so a wait can end at the deadline) per stripe,
	// chosen by the bytes' digest. wazero v1.12 publishes a module read
	// from its file cache to other compilations of the same bytes before
	// it has finished preparing it (its entry preambles), and an instance
	// made from it then reads them unset: a data race, and at times an
	// index-out-of-range panic that ends the process (two plugins of the
	// same file, loaded in parallel).
	compiling [64]chan struct{}
}

// NewRuntime returns a Runtime with the given options.
func NewRuntime(opts Options) (*Runtime, error) {
	if opts.CheckedCacheBytes < 0 || opts.CompiledCacheBytes < 0 {
		return nil, fmt.Errorf("sandbox: cache bounds %d and %d bytes: a bound must not be negative (0: the default)", opts.CheckedCacheBytes, opts.CompiledCacheBytes)
	}
	r := &Runtime{log: opts.Logger, interrupt: opts.Interruption, checkedReading: map[string]int{},
		checkedBound: cmp.Or(opts.CheckedCacheBytes, checkedMaxBytes), compiledBound: cmp.Or(opts.CompiledCacheBytes, compiledMaxBytes)}
	for i := range r.compiling {
		r.compiling[i] = make(chan struct{}, 1)
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("sandbox: compilation cache at %s: %w (choose another directory, or none)", opts.CacheDir, err)
		}
		r.cache = c
		r.cacheDir, _ = filepath.Abs(opts.CacheDir)
		r.memCache = wazero.NewCompilationCache()
	} else {
		r.cache = wazero.NewCompilationCache()
	}
	return r, nil
}

// Close releases the compilation cache, once every compilation still
// running has ended: one that passed its deadline goes on in the
// background, and wazero's engine, which the cache holds, must not be
// closed under it (wazero v1.12 then writes into the closed engine's
// table and panics, ending the process); and once the sweep of the
// checked-module cache a first compilation started, and the eviction of
// machine code compilations start (wazero_cache.go), have ended, so that
// nothing of the Runtime outlives Close. If ctx ends first, Close leaves
// the cache open and says so. It does not close the Compiled modules the
// Runtime made.
func (r *Runtime) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		r.inflight.Wait()
		r.sweeping.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("sandbox: close: compilations, or the checked-module cache's sweep, still running; the cache is left open: %w", ctx.Err())
	}
	err := r.cache.Close(ctx)
	if r.memCache != nil {
		err = errors.Join(err, r.memCache.Close(ctx))
	}
	return err
}

// DiskCacheError returns the last error of the disk cache (see
// [Options.CacheDir]), nil if it never failed. A compilation whose
// cache could not be read or written is done again without it: the
// error costs time at the next start, never a plugin.
func (r *Runtime) DiskCacheError() error {
	if p := r.diskErr.Load(); p != nil {
		return *p
	}
	return nil
}

// diskCacheRetry is how long compilations skip a disk cache that could
// not be written before trying it again.
const diskCacheRetry = time.Minute

// cacheNow returns the compilation cache to compile with now.
func (r *Runtime) cacheNow() wazero.CompilationCache {
	if r.memCache != nil && time.Now().UnixNano() < r.diskOffUntil.Load() {
		return r.memCache
	}
	return r.cache
}

// diskCacheFailed reports whether err is the disk cache failing to be
// read or written (wazero returns its file errors as they are), and if
// so turns the disk cache off for diskCacheRetry, saying so once.
func (r *Runtime) diskCacheFailed(err error) bool {
	if r.cacheDir == "" {
		return false
	}
	var path string
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		path = pe.Path
	case errors.As(err, &le):
		path = le.New
	default:
		return false
	}
	if rel, rerr := filepath.Rel(r.cacheDir, path); rerr != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return false
	}
	r.diskErr.Store(&err)
	now := time.Now()
	if prev := r.diskOffUntil.Swap(now.Add(diskCacheRetry).UnixNano()); prev < now.UnixNano() {
		r.log.Warn("compilation cache unusable: compiling without it (the plugins load, but each start compiles them again); tried again in a minute",
			"dir", r.cacheDir, "error", err)
	}
	return true
}

// Compile validates and compiles wasm under policy p. It fails, without
// running any guest code, when p is not valid ([Policy.Validate]), wasm is
// not a WebAssembly module, is over one of p's [ModuleLimits] (a
// [*LimitError]), does not validate, imports something this host does not
// provide (the error names each), needs more memory than p allows, or
// takes longer than p's compile timeout to compile (an error matching
// context.DeadlineExceeded).
//
// Each Compiled has a wazero runtime of its own, since memory limits are a
// runtime setting; machine code is shared through the Runtime's cache.
func (r *Runtime) Compile(ctx context.Context, wasm []byte, p Policy) (*Compiled, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if err := checkHeader(wasm); err != nil {
		return nil, err
	}
	// The compile timeout covers the whole of it: the check and the
	// rewriting (two passes over the module, as long as wazero's
	// compilation for a module of many small loops) as well as wazero's
	// compilation. A review found a module of 1,000 functions of 2,000
	// loops each returned 15 s past its timeout on a loaded machine.
	deadline := time.Now().Add(cmp.Or(p.compileTimeout, DefaultCompileTimeout))
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := p.network.checkGrants(); err != nil {
		return nil, fmt.Errorf("network grant: %w", err)
	}
	sum := sha256.Sum256(wasm)
	flag := r.interrupt == InterruptFlag
	var snap *snapModule
	key, maxSize := checkedKey(sum, p.moduleLimits, flag), p.ModuleLimits().MaxModuleSize
	if c, ok := r.loadChecked(key, maxSize); ok {
		wasm, snap = c.wasm, c.snap.module()
	} else {
		var err error
		if wasm, snap, err = checkAndRewrite(pctx, wasm, p.moduleLimits, flag); err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		r.storeChecked(key, &checked{wasm: wasm, snap: checkedSnap{Refusal: snap.refusal, Globals: snap.globals, HasStart: snap.hasStart}}, maxSize)
	}
	left := time.Until(deadline)
	if err := pctx.Err(); err != nil || left <= 0 {
		return nil, fmt.Errorf("compile: %w", cmp.Or(err, context.DeadlineExceeded))
	}
	wasm, customs := splitCustom(wasm, !flag)
	cache := r.cacheNow()
	rt, mod, err := r.compileIn(ctx, cache, wasm, flag, p, left)
	if err != nil && cache != r.memCache && r.diskCacheFailed(err) {
		rt, mod, err = r.compileIn(ctx, r.memCache, wasm, flag, p, time.Until(deadline))
	}
	if err != nil {
		return nil, err
	}
	r.evictCompiledSoon()
	closeRT := func(err error) error {
		if cerr := rt.Close(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return err
	}
	c, err := newCompiled(rt, mod, p)
	if err != nil {
		return nil, closeRT(err)
	}
	c.sha256, c.snap, c.customs = sum, snap, customs
	c.snap.policyRefusal(c)
	c.decideImages()
	return c, nil
}

// checkAndRewrite checks wasm against limits and rewrites it as Compile
// gives it to wazero: data segments merged, mutable globals exported for
// snapshots (when the module can have them), tables capped, and, with
// flag, the interruption's checks added. snap says what the check learnt
// for snapshots.
func checkAndRewrite(ctx context.Context, wasm []byte, limits ModuleLimits, flag bool) (_ []byte, snap *snapModule, err error) {
	chk, err := checkModuleCtx(ctx, wasm, limits)
	if err != nil {
		return nil, nil, err
	}
	wasm = chk.mergeData(wasm)
	snap = chk.snapModule()
	if snap.refusal == "" {
		wasm = chk.exportGlobals(wasm)
	}
	wasm = chk.capTables(wasm)
	if flag {
		if wasm, err = instrumentCtx(ctx, wasm); err != nil {
			return nil, nil, err
		}
	}
	return wasm, snap, nil
}

// compileIn compiles wasm, rewritten as Compile rewrites it, in a new
// wazero runtime of p's limits that shares cache's machine code. On an
// error the runtime is closed (or left to the overrunning compilation,
// which closes it).
func (r *Runtime) compileIn(ctx context.Context, cache wazero.CompilationCache, wasm []byte, flag bool, p Policy, left time.Duration) (wazero.Runtime, wazero.CompiledModule, error) {
	if left <= 0 {
		return nil, nil, fmt.Errorf("compile: %w", context.DeadlineExceeded)
	}
	cfg := wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithCloseOnContextDone(!flag).
		// The instrumented code no longer matches the offsets of the
		// module's DWARF sections: trap traces name functions only.
		WithDebugInfoEnabled(!flag).
		WithMemoryLimitPages(p.memoryLimitPages()).
		WithCustomSections(true)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if err := defineHost(ctx, rt); err != nil {
		return nil, nil, errors.Join(err, rt.Close(ctx))
	}
	mod, err := r.compileModule(ctx, rt, wasm, left)
	if err != nil {
		if isOverrun(err) {
			return nil, nil, err // rt is closed when the compilation ends
		}
		return nil, nil, errors.Join(err, rt.Close(ctx))
	}
	return rt, mod, nil
}

func checkHeader(wasm []byte) error {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return errors.New("not a WebAssembly module (no \\0asm magic number)")
	}
	if wasm[4] != 1 || wasm[5] != 0 || wasm[6] != 0 || wasm[7] != 0 {
		return errors.New("not a WebAssembly core module of version 1 (a component? only core modules are supported)")
	}
	return nil
}

// overrunError is a compilation abandoned at its deadline, whose runtime
// the background compilation closes.
type overrunError struct{ err error }

func (e *overrunError) Error() string { return "compile: " + e.err.Error() }
func (e *overrunError) Unwrap() error { return e.err }

func isOverrun(err error) bool {
	var o *overrunError
	return errors.As(err, &o)
}

// compileWorkers is how many goroutines compile one module's functions.
// wazero checks the context only in its parallel compiler (two workers or
// more), between functions; its default, one worker, never stops.
const compileWorkers = 2

// compileRecovered is rt.CompileModule with a panic in wazero's decoder or
// validator (both run on the caller's goroutine) made an error: the bytes
// are a stranger's, and the checker cannot know every way wazero fails.
func compileRecovered(ctx context.Context, rt wazero.Runtime, wasm []byte) (mod wazero.CompiledModule, err error) {
	defer func() {
		if p := recover(); p != nil {
			mod, err = nil, fmt.Errorf("wazero panicked reading the module: %v", p)
		}
	}()
	return rt.CompileModule(ctx, wasm)
}

// compileModule compiles wasm in rt within timeout (zero or less meaning
// the default). wazero checks the context only between functions, so a
// compilation past its deadline, or whose ctx is cancelled, is left to
// finish on its goroutine: the function each compiler worker is in (which
// ModuleLimits bound), then wazero sees the cancelled context and stops.
// Decoding and validating the module, before, cannot be stopped either;
// they take time linear in the module's size within ModuleLimits.
// That goroutine then closes rt, which nothing else holds: the
// compilation holds no lock of the Runtime's, and wazero's engine locks
// its shared tables only around lookups and inserts, not while
// compiling.
func (r *Runtime) compileModule(ctx context.Context, rt wazero.Runtime, wasm []byte, timeout time.Duration) (wazero.CompiledModule, error) {
	if timeout <= 0 {
		timeout = DefaultCompileTimeout
	}
	cctx, cancel := context.WithTimeout(experimental.WithCompilationWorkers(ctx, compileWorkers), timeout)
	type result struct {
		mod wazero.CompiledModule
		err error
	}
	done := make(chan result, 1)
	sum := sha256.Sum256(wasm)
	lock := r.compiling[sum[0]%byte(len(r.compiling))]
	select {
	case lock <- struct{}{}:
	case <-cctx.Done():
		cancel()
		return nil, fmt.Errorf("compile: waiting for another compilation of the same bytes: %w", cctx.Err())
	}
	r.inflight.Add(1)
	r.running.Add(1)
	go func() {
		defer r.inflight.Done()
		defer r.running.Add(-1)
		mod, err := compileRecovered(cctx, rt, wasm)
		<-lock
		done <- result{mod, err}
	}()
	select {
	case res := <-done:
		// The cause is read before cancel, which would make every
		// error read as a cancellation.
		if res.err != nil {
			err := contextCause(cctx, res.err)
			cancel()
			return nil, fmt.Errorf("compile: %w", err)
		}
		cancel()
		return res.mod, nil
	case <-cctx.Done():
	}
	cancel()
	n := r.overrun.Add(1)
	if ctx.Err() != nil {
		// The caller gave up (the server shutting down, the file
		// replaced, a slow load put off): no deadline passed.
		r.log.Debug("compilation stopped: its caller gave up; it ends in the background", "cause", context.Cause(ctx), "overrunning", n)
	} else {
		r.log.Warn("compilation stopped at its deadline; it ends in the background", "timeout", timeout, "overrunning", n)
	}
	go func() {
		<-done
		_ = rt.Close(context.Background())
		r.overrun.Add(-1)
	}()
	err := cctx.Err()
	if ctx.Err() == nil {
		err = fmt.Errorf("took longer than the compile timeout of %v: %w", timeout, err)
	}
	return nil, &overrunError{err}
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
// It checks the module against the default [ModuleLimits] and compiles it
// within the default compile timeout.
func (r *Runtime) Inspect(ctx context.Context, wasm []byte) (*ModuleInfo, error) {
	if err := checkHeader(wasm); err != nil {
		return nil, err
	}
	chk, err := checkModule(wasm, ModuleLimits{})
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	wasm = chk.capTables(wasm)
	compile := func(cache wazero.CompilationCache) (wazero.Runtime, wazero.CompiledModule, error) {
		rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
		mod, err := r.compileModule(ctx, rt, wasm, DefaultCompileTimeout)
		if err != nil && !isOverrun(err) {
			_ = rt.Close(ctx)
		}
		return rt, mod, err
	}
	cache := r.cacheNow()
	rt, mod, err := compile(cache)
	if err != nil && cache != r.memCache && r.diskCacheFailed(err) {
		rt, mod, err = compile(r.memCache)
	}
	if err != nil {
		return nil, err
	}
	r.evictCompiledSoon()
	defer rt.Close(ctx)
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
