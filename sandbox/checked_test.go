package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/sandbox"
)

// TestCheckedCache: a module's checked and rewritten bytes are kept beside
// the machine code, and a later start compiles from them; a module so
// compiled is still stopped at its deadline (the interruption's checks
// are in what was kept); an entry torn or altered is ignored and written
// anew; other module limits make another entry.
func TestCheckedCache(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	module := wat(t, spinnerModule(`(func (export "run") (result i32) (loop $l (br $l)) (i32.const 0))`))
	policy := sandbox.NewPolicy().WithCallTimeout(200 * time.Millisecond)
	compile := func(p sandbox.Policy) *sandbox.Compiled {
		t.Helper()
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close(ctx) })
		c, err := rt.Compile(ctx, module, p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	compile(policy)
	entries := sandbox.CheckedEntries(dir)
	if len(entries) != 1 {
		t.Fatalf("after a compilation the checked cache holds %v, want one entry", entries)
	}

	// A mark in the kept bytes shows the next start compiled from them.
	const mark = "from-the-checked-cache"
	err := sandbox.EditCheckedEntry(entries[0], func(wasm []byte) []byte {
		content := append([]byte{byte(len(mark))}, mark...)
		return append(append(wasm, 0, byte(len(content))), content...)
	})
	if err != nil {
		t.Fatal(err)
	}
	c := compile(policy)
	if c.CustomSection(mark) == nil {
		t.Fatal("a new runtime on the same cache checked the module again: the kept bytes were not used")
	}
	inst, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	var te *sandbox.TrapError
	if _, err := inst.Call(ctx, "run", nil, nil); !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &te) {
		t.Fatalf("a spinner compiled from the checked cache: %v; want a TrapError at its deadline", err)
	}

	// A torn entry: checked afresh, and written again.
	b, err := os.ReadFile(entries[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(entries[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	if c := compile(policy); c.CustomSection(mark) != nil {
		t.Error("an entry whose digest does not match was used")
	}
	if !sandbox.CheckedEntrySound(entries[0]) {
		t.Error("the torn entry was not written again")
	}

	// Other limits: another entry.
	compile(policy.WithModuleLimits(sandbox.ModuleLimits{MaxLoops: 7}))
	if got := sandbox.CheckedEntries(dir); len(got) != 2 || !slices.Contains(got, entries[0]) {
		t.Errorf("after a compilation under other limits the checked cache holds %v, want two entries", got)
	}
}

// TestCheckedCacheWritesWhatItReads: an entry a later start could not
// read is not written. A module the rewriting makes several times larger
// (functions, each given the interruption's check: 7 times here), under a
// max_module_size that just fits it, was written at every start and
// never read: the loader reads at most twice the limit and a MiB.
func TestCheckedCacheWritesWhatItReads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	module := wat(t, `(module `+strings.Repeat(`(func)`, 80_000)+`)`)
	policy := sandbox.NewPolicy().WithModuleLimits(sandbox.ModuleLimits{MaxModuleSize: uint64(len(module))})
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	compile := func() *sandbox.Compiled {
		t.Helper()
		c, err := rt.Compile(ctx, module, policy)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	compile()
	entries := sandbox.CheckedEntries(dir)
	if len(entries) == 0 {
		return
	}
	const mark = "from-the-checked-cache"
	err = sandbox.EditCheckedEntry(entries[0], func(wasm []byte) []byte {
		content := append([]byte{byte(len(mark))}, mark...)
		return append(append(wasm, 0, byte(len(content))), content...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if compile().CustomSection(mark) == nil {
		fi, _ := os.Stat(entries[0])
		t.Errorf("an entry of %d bytes, for a module of %d, was written and is not read", fi.Size(), len(module))
	}
}

// TestCheckedCacheConcurrentWriters: compilations of one module at once,
// in two runtimes on one cache folder (as two processes), each find no
// entry or a whole one, never a torn one: each writes a file of its own
// and renames it into place. One sound entry is left, and no file beside.
func TestCheckedCacheConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	module := wat(t, spinnerModule(`(func (export "run") (result i32) (loop $l (br $l)) (i32.const 0))`))
	var rts []*sandbox.Runtime
	for range 2 {
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close(ctx)
		rts = append(rts, rt)
	}
	errs := make(chan error, 16)
	for i := range cap(errs) {
		go func() {
			c, err := rts[i%2].Compile(ctx, module, sandbox.NewPolicy())
			if err == nil {
				c.Close(ctx)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if entries := sandbox.CheckedEntries(dir); len(entries) != 1 || !sandbox.CheckedEntrySound(entries[0]) {
		t.Errorf("the checked cache holds %v, want one sound entry", entries)
	}
}

// TestCheckedCacheSweep: a runtime's first compilation removes other
// builds' folders of entries left unwritten for a week, and nothing else
// in a cache folder it may share: not a younger build's folder, nor what
// is not named as ours, and of a link named as ours, the link only; nor
// anything outside the cache folder, whose name is not a pattern (one
// with "[" or "*" in it).
func TestCheckedCacheSweep(t *testing.T) {
	for _, name := range []string{"cache", "c[1]*"} {
		t.Run(name, func(t *testing.T) { testCheckedCacheSweep(t, name) })
	}
}

func testCheckedCacheSweep(t *testing.T, name string) {
	ctx := context.Background()
	base, outside := t.TempDir(), t.TempDir()
	dir := filepath.Join(base, name)
	week := time.Now().Add(-8 * 24 * time.Hour)
	mkdir := func(path string, old bool) {
		t.Helper()
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if old {
			if err := os.Chtimes(path, week, week); err != nil {
				t.Fatal(err)
			}
		}
	}
	mkdir(filepath.Join(dir, "wasmtools-checked-0000000000000000"), true)
	mkdir(filepath.Join(dir, "wasmtools-checked-1111111111111111"), false)
	mkdir(filepath.Join(dir, "not-ours"), true)
	mkdir(filepath.Join(outside, "target"), true)
	mkdir(filepath.Join(base, "c1-another-cache", "wasmtools-checked-3333333333333333"), true)
	if err := os.Symlink(filepath.Join(outside, "target"), filepath.Join(dir, "wasmtools-checked-2222222222222222")); err != nil {
		t.Fatal(err)
	}
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	c, err := rt.Compile(ctx, wat(t, `(module)`), sandbox.NewPolicy())
	if err != nil {
		rt.Close(ctx)
		t.Fatal(err)
	}
	c.Close(ctx)
	// Closed, the runtime has swept.
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		filepath.Join(dir, "wasmtools-checked-0000000000000000"):                      false,
		filepath.Join(dir, "wasmtools-checked-1111111111111111"):                      true,
		filepath.Join(dir, "not-ours"):                                                true,
		filepath.Join(dir, "wasmtools-checked-2222222222222222"):                      false,
		filepath.Join(base, "c1-another-cache", "wasmtools-checked-3333333333333333"): true,
	} {
		if _, err := os.Lstat(path); (err == nil) != want {
			t.Errorf("%s: there %v, want %v", path, err == nil, want)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "target", "f")); err != nil {
		t.Errorf("the sweep reached through a link: %v", err)
	}
}

// TestCheckedCacheSweepsHalfWritten: a write a crash left half done (the
// temporary file an entry is written to before its rename) is removed by
// a later runtime once it is a day old, not kept for good; a younger one
// may be another process's write under way, and stays.
func TestCheckedCacheSweepsHalfWritten(t *testing.T) {
	dir := t.TempDir()
	module := wat(t, `(module)`)
	compileIn(t, dir, module)
	entries := sandbox.CheckedEntries(dir)
	if len(entries) != 1 {
		t.Fatalf("the checked cache holds %v, want one entry", entries)
	}
	old, young := filepath.Join(filepath.Dir(entries[0]), ".a.1"), filepath.Join(filepath.Dir(entries[0]), ".b.2")
	for _, f := range []string{old, young} {
		if err := os.WriteFile(f, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(old, day, day); err != nil {
		t.Fatal(err)
	}
	compileIn(t, dir, module)
	if _, err := os.Stat(old); err == nil {
		t.Error("a half-written entry a day old was kept")
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a write that may be under way was removed: %v", err)
	}
}

// compileIn compiles module under the default policy in a runtime of its
// own on the cache folder dir, and closes both.
func compileIn(t *testing.T, dir string, module []byte) {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	c, err := rt.Compile(ctx, module, sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
}

// TestCheckedCacheSweepOffCompile: the sweep of the checked-module cache
// a runtime's first compilation starts does not hold that compilation,
// nor others begun meanwhile: it ran inside the first, and every
// compilation of a starting server waited for it. Closing the runtime
// waits for it, so that nothing of the runtime outlives Close.
func TestCheckedCacheSweepOffCompile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	old := filepath.Join(dir, "wasmtools-checked-0000000000000000")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	week := time.Now().Add(-8 * 24 * time.Hour)
	if err := os.Chtimes(old, week, week); err != nil {
		t.Fatal(err)
	}
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	rt.SetSweepHook(func() { close(entered); <-release })
	module := wat(t, `(module)`)
	errs := make(chan error, 2)
	for range cap(errs) {
		go func() {
			c, err := rt.Compile(ctx, module, sandbox.NewPolicy())
			if err == nil {
				c.Close(ctx)
			}
			errs <- err
		}()
	}
	<-entered
	// Only a failure waits this long: the compilations return at once.
	timeout := time.After(30 * time.Second)
	for range cap(errs) {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
			continue
		case <-timeout:
			t.Error("compilations waited for the checked cache's sweep")
			unblock()
		}
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	unblock()
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err == nil {
		t.Error("Close returned before the sweep removed another build's old folder")
	}
}

// TestCheckedCacheBounded: this build's folder of entries is bounded in
// bytes: a write past the bound removes the entries used least recently
// (read or written), never the one just written, and a module whose
// entry was removed still compiles, checked afresh and written again.
// Every module changed (a plugin rebuilt, a tag moved) left its entry
// for good.
func TestCheckedCacheBounded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	modules := map[string][]byte{}
	for _, name := range []string{"a", "b", "c"} {
		modules[name] = wat(t, `(module (func (export "`+name+`")))`)
	}
	runtime := func(bound int64) *sandbox.Runtime {
		t.Helper()
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir, CheckedCacheBytes: bound})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close(ctx) })
		return rt
	}
	entryOf := map[string]string{}
	var sizes int64
	compile := func(rt *sandbox.Runtime, name string) {
		t.Helper()
		before := sandbox.CheckedEntries(dir)
		c, err := rt.Compile(ctx, modules[name], sandbox.NewPolicy())
		if err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
		for _, e := range sandbox.CheckedEntries(dir) {
			if !slices.Contains(before, e) && entryOf[name] == "" {
				entryOf[name] = e
				fi, err := os.Stat(e)
				if err != nil {
					t.Fatal(err)
				}
				sizes += fi.Size()
			}
		}
	}
	// a and b written an hour and two ago.
	first := runtime(0)
	for i, name := range []string{"a", "b"} {
		compile(first, name)
		at := time.Now().Add(time.Duration(i-3) * time.Hour)
		if err := os.Chtimes(entryOf[name], at, at); err != nil {
			t.Fatal(err)
		}
	}
	// A later start reads a (the oldest written, now the last used), then
	// writes c: the three are over the bound by a byte, and b, used least
	// recently, goes.
	compile(first, "c")
	if err := os.Remove(entryOf["c"]); err != nil {
		t.Fatal(err)
	}
	rt := runtime(sizes - 1)
	compile(rt, "a")
	compile(rt, "c")
	for name, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if _, err := os.Stat(entryOf[name]); (err == nil) != want {
			t.Errorf("entry of %s, past the bound: kept %v, want %v", name, err == nil, want)
		}
	}
	// b's entry removed, b compiles, checked afresh, and is kept again.
	compile(rt, "b")
	if !sandbox.CheckedEntrySound(entryOf["b"]) {
		t.Error("a module whose entry was removed: not written again")
	}
	if got := len(sandbox.CheckedEntries(dir)); got != 2 {
		t.Errorf("the cache holds %d entries after b's was written again, want 2 (the bound holds two)", got)
	}
}

// TestCheckedCacheBoundSparesReads: an entry being read is not removed
// by a write past the bound meanwhile, though it is the one used least
// recently.
func TestCheckedCacheBoundSparesReads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := wat(t, `(module (func (export "a")))`), wat(t, `(module (func (export "b")))`)
	compileIn(t, dir, a)
	entries := sandbox.CheckedEntries(dir)
	if len(entries) != 1 {
		t.Fatalf("the checked cache holds %v, want a's entry", entries)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(entries[0], old, old); err != nil {
		t.Fatal(err)
	}
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir, CheckedCacheBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rt.SetCheckedReadHook(func() { once.Do(func() { close(entered); <-release }) })
	errs := make(chan error, 1)
	go func() {
		c, err := rt.Compile(ctx, a, sandbox.NewPolicy())
		if err == nil {
			c.Close(ctx)
		}
		errs <- err
	}()
	select {
	case <-entered:
	case err := <-errs:
		t.Fatalf("a's compilation ended (%v) without reading its entry", err)
	}
	cb, err := rt.Compile(ctx, b, sandbox.NewPolicy())
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	cb.Close(ctx)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(entries[0]); err != nil {
		t.Errorf("an entry being read was removed by a write past the bound: %v", err)
	}
}
