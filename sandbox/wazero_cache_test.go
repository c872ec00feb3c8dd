package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/sandbox"
)

// wazeroFiles lists the files of machine code (64 hex digits) in
// wazero's folder of the cache folder dir.
func wazeroFiles(t *testing.T, dir string) []string {
	t.Helper()
	found, err := os.ReadDir(sandbox.WazeroCacheDir(dir))
	if err != nil {
		t.Fatalf("wazero's folder: %v", err)
	}
	var names []string
	for _, e := range found {
		if len(e.Name()) == 64 && strings.Trim(e.Name(), "0123456789abcdef") == "" {
			names = append(names, e.Name())
		}
	}
	return names
}

// compileNew compiles module in rt and reports the file of machine code
// it added to wazero's folder of dir ("" if none).
func compileNew(t *testing.T, rt *sandbox.Runtime, dir string, module []byte) string {
	t.Helper()
	ctx := context.Background()
	before := wazeroFiles(t, dir)
	c, err := rt.Compile(ctx, module, sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inst.Close(ctx)
	c.Close(ctx)
	for _, f := range wazeroFiles(t, dir) {
		if !slices.Contains(before, f) {
			return f
		}
	}
	return ""
}

func setTime(t *testing.T, path string, ago time.Duration) {
	t.Helper()
	at := time.Now().Add(-ago)
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

// runtimeOn returns a runtime on the cache folder dir, its folder of
// machine code bounded to bound bytes (0: the default), closed at the
// test's end.
func runtimeOn(t *testing.T, dir string, bound int64) *sandbox.Runtime {
	t.Helper()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir, CompiledCacheBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	return rt
}

func sizeOf(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestDiskCacheBounded: wazero's folder of machine code is bounded in
// bytes: past the bound, its files used least recently go, and nothing
// else: not the module's just used, not another's files in the folder,
// not what a link in it points to. wazero removes none, so every module
// ever compiled (plugins rebuilt, tags moved) left its code for good.
func TestDiskCacheBounded(t *testing.T) {
	ctx := context.Background()
	dir, outside := t.TempDir(), t.TempDir()
	module := wat(t, `(module (func (export "a")))`)
	code := compileNew(t, runtimeOn(t, dir, 0), dir, module)
	if code == "" {
		t.Fatal("compiling wrote no file of machine code")
	}
	wdir := sandbox.WazeroCacheDir(dir)
	fake := func(i int) string { return filepath.Join(wdir, strings.Repeat(fmt.Sprint(i), 64)) }
	for i, ago := range []time.Duration{4 * time.Hour, 3 * time.Hour, 2 * time.Hour} {
		if err := os.WriteFile(fake(i+1), make([]byte, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		setTime(t, fake(i+1), ago)
	}
	// Not wazero's files of machine code, older than every one.
	target := filepath.Join(outside, "target")
	others := []string{filepath.Join(wdir, "notes"), fake(7) + ".1.tmp", target, filepath.Join(dir, "beside")}
	for _, p := range others {
		if err := os.WriteFile(p, make([]byte, 5000), 0o600); err != nil {
			t.Fatal(err)
		}
		setTime(t, p, 5*time.Hour)
	}
	if err := os.Symlink(target, fake(8)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(fake(9), 0o700); err != nil {
		t.Fatal(err)
	}
	others = append(others, fake(8), fake(9))
	// The bound holds the module's code, one fake file and half another:
	// the two oldest go.
	rt := runtimeOn(t, dir, sizeOf(t, filepath.Join(wdir, code))+1500)
	compileNew(t, rt, dir, module)
	if err := rt.Close(ctx); err != nil { // waits for the eviction
		t.Fatal(err)
	}
	for path, want := range map[string]bool{fake(1): false, fake(2): false, fake(3): true, filepath.Join(wdir, code): true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s past the bound: kept %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
	for _, p := range others {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("not wazero's, yet removed: %v", err)
		}
	}
}

// TestDiskCacheEvictedRecompiles: a module whose machine code was
// evicted still loads, compiled again, and its code is written again.
func TestDiskCacheEvictedRecompiles(t *testing.T) {
	dir := t.TempDir()
	a, b := wat(t, `(module (func (export "a")))`), wat(t, `(module (func (export "b")))`)
	first := runtimeOn(t, dir, 0)
	codeA, codeB := compileNew(t, first, dir, a), compileNew(t, first, dir, b)
	if codeA == "" || codeB == "" {
		t.Fatal("compiling wrote no file of machine code")
	}
	wdir := sandbox.WazeroCacheDir(dir)
	setTime(t, filepath.Join(wdir, codeA), time.Hour)
	// A later start loads b (from its file): a's code, older, goes.
	rt := runtimeOn(t, dir, sizeOf(t, filepath.Join(wdir, codeB)))
	compileNew(t, rt, dir, b)
	if err := rt.Close(context.Background()); err != nil { // waits for the eviction
		t.Fatal(err)
	}
	if got := wazeroFiles(t, dir); !slices.Equal(got, []string{codeB}) {
		t.Fatalf("past the bound, wazero's folder holds %v, want b's code alone", got)
	}
	if got := compileNew(t, runtimeOn(t, dir, 0), dir, a); got != codeA {
		t.Errorf("a, its code evicted, compiled again wrote %q, want %q", got, codeA)
	}
}

// TestDiskCacheSweepsOtherVersions: in the folders of other wazero
// versions (an upgrade leaves them), files unused for a week go, the
// folders stay (a process of that version still running writes to
// its); in every wazero folder, temporary files a day old (a crash's)
// go; nothing is reached through a link.
func TestDiskCacheSweepsOtherVersions(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	old := filepath.Join(dir, "wazero-v1.0.0-amd64-linux")
	linked := filepath.Join(dir, "wazero-v1.1.0-amd64-linux")
	mine := sandbox.WazeroCacheDir(dir)
	for _, d := range []string{old, mine} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, linked); err != nil {
		t.Fatal(err)
	}
	entry := func(d string, i int) string { return filepath.Join(d, strings.Repeat(fmt.Sprint(i), 64)) }
	week, day := 8*24*time.Hour, 25*time.Hour
	files := map[string]bool{ // kept?
		entry(old, 1):              false,
		entry(old, 2):              true, // used an hour ago
		entry(old, 3) + ".12.tmp":  false,
		entry(old, 4) + ".34.tmp":  true, // a write under way
		filepath.Join(old, "keep"): true,
		entry(mine, 5):             true, // mine is bounded in bytes, not aged
		entry(mine, 6) + ".56.tmp": false,
		entry(outside, 7):          true,
	}
	for p := range files {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		ago := week
		if strings.HasSuffix(p, ".tmp") {
			ago = day
		}
		if p == entry(old, 2) || p == entry(old, 4)+".34.tmp" {
			ago = time.Hour
		}
		setTime(t, p, ago)
	}
	compileIn(t, dir, wat(t, `(module)`))
	for p, want := range files {
		if _, err := os.Lstat(p); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", p, err == nil, want)
		}
	}
	for _, d := range []string{old, linked} {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("another version's folder removed: %v", err)
		}
	}
}

// TestDiskCacheBoundConcurrent: compilations ending together, each
// starting an eviction, while others load: every module loads, and once
// the runtime is closed the folder is within its bound (the newest file
// alone, with a bound of a byte).
func TestDiskCacheBoundConcurrent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var modules [][]byte
	for i := range 6 {
		modules = append(modules, wat(t, fmt.Sprintf(`(module (func (export "f%d")))`, i)))
	}
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir, CompiledCacheBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for round := range 2 {
		for i, m := range modules {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := rt.Compile(ctx, m, sandbox.NewPolicy())
				if err != nil {
					t.Errorf("round %d, module %d: %v", round, i, err)
					return
				}
				c.Close(ctx)
			}()
		}
		wg.Wait()
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := wazeroFiles(t, dir); len(got) != 1 {
		t.Errorf("wazero's folder holds %d files past a bound of a byte, want the newest alone", len(got))
	}
	for _, m := range modules { // each loads, compiled again or not
		compileIn(t, dir, m)
	}
}

// TestDiskCacheKeepsWhatWasRead: a file of machine code written long ago
// but read since (its access time, where the file system keeps one) is
// kept over one written later and not read since: wazero never touches a
// file it reads, and by its write alone a module loaded every day went
// before one loaded once.
func TestDiskCacheKeepsWhatWasRead(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("access times are read on Linux only")
	}
	ctx := context.Background()
	dir := t.TempDir()
	module := wat(t, `(module (func (export "a")))`)
	code := compileNew(t, runtimeOn(t, dir, 0), dir, module)
	wdir := sandbox.WazeroCacheDir(dir)
	read, unread := filepath.Join(wdir, strings.Repeat("1", 64)), filepath.Join(wdir, strings.Repeat("2", 64))
	for _, p := range []string{read, unread} {
		if err := os.WriteFile(p, make([]byte, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if err := os.Chtimes(read, now.Add(-time.Minute), now.Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	setTime(t, unread, 2*time.Hour)
	rt := runtimeOn(t, dir, sizeOf(t, filepath.Join(wdir, code))+1500)
	compileNew(t, rt, dir, module)
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{read: true, unread: false} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s past the bound: kept %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
}

// TestCacheBoundNegative: a negative bound of either half of the cache
// folder is refused, not taken for none.
func TestCacheBoundNegative(t *testing.T) {
	for _, opts := range []sandbox.Options{{CacheDir: t.TempDir(), CheckedCacheBytes: -1}, {CacheDir: t.TempDir(), CompiledCacheBytes: -1}} {
		if rt, err := sandbox.NewRuntime(opts); err == nil {
			rt.Close(context.Background())
			t.Errorf("bounds %d and %d: a runtime made; want an error", opts.CheckedCacheBytes, opts.CompiledCacheBytes)
		}
	}
}
