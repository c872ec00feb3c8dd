// Package testplugins finds the .wasm plugins that tests run: the examples
// (examples/plugins/dist) and the test plugins built from
// internal/testplugins/src (internal/testplugins/dist). `make plugins
// testplugins` builds both; `make test` does it before testing.
package testplugins

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/sandbox"
)

// Root returns the repository's root folder.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Example returns the path of the built example plugin name.
func Example(t testing.TB, name string) string {
	return find(t, filepath.Join(Root(), "examples", "plugins", "dist", name+".wasm"))
}

// Test returns the path of the built test plugin name.
func Test(t testing.TB, name string) string {
	return find(t, filepath.Join(Root(), "internal", "testplugins", "dist", name+".wasm"))
}

// Bytes returns the contents of a plugin file.
func Bytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func find(t testing.TB, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("plugin %s is not built: run `make plugins testplugins` (or `make test`) first: %v", path, err)
	}
	return path
}

// Folder returns a new temporary folder holding copies of the given plugin
// files, named as given (name -> source path).
func Folder(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), Bytes(t, src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// CacheDir returns a compilation cache folder shared by test runs, so that
// tests which load the same Go plugin many times compile it once.
func CacheDir() string {
	return filepath.Join(os.TempDir(), "wasmtools-test-cache")
}

// RSS returns the process's resident set size in bytes, after a garbage
// collection that returns freed memory to the OS. It skips the test where
// /proc is missing. RSS counts a page once for each mapping of it: a page
// of a plugin's pre-initialised image mapped by 1,000 instances counts
// 1,000 times, though memory holds it once; see [PSS].
func RSS(t testing.TB) int64 { return procBytes(t, "/proc/self/status", "VmRSS:") }

// AddressSpace returns the process's virtual memory size in bytes
// (VmSize: every mapping, reserved or not, such as an instance's
// reservation of its memory limit), after a garbage collection. It skips
// the test where /proc is missing.
func AddressSpace(t testing.TB) int64 { return procBytes(t, "/proc/self/status", "VmSize:") }

// PSS returns the process's proportional set size in bytes, after a
// garbage collection that returns freed memory to the OS: each page
// counted once, divided among the mappings that share it (in this process
// or others). It is what the process's pages cost the machine, and what
// the benchmarks report for memory. It skips the test where /proc is
// missing.
func PSS(t testing.TB) int64 { return procBytes(t, "/proc/self/smaps_rollup", "Pss:") }

// procBytes reads a "Field: N kB" line of a /proc file, after a GC.
func procBytes(t testing.TB, path, field string) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Skip("no "+path+":", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	t.Fatalf("no %s in %s", field, path)
	return 0
}

// Runtime returns a sandbox runtime sharing the test compilation cache,
// closed when the test ends.
func Runtime(t testing.TB) *sandbox.Runtime {
	t.Helper()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	return rt
}
