package sandbox_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
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
