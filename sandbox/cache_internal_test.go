package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/tetratelabs/wazero"
)

// TestDiskCacheUnusableCompilesWithout: a compilation cache that cannot be
// read or written (a full or read-only volume, a folder replaced) costs
// the next start its time, never a plugin: the module is compiled without
// it, and DiskCacheError says why. Every plugin failed to load on a full
// cache volume before.
func TestDiskCacheUnusableCompilesWithout(t *testing.T) {
	dir := t.TempDir()
	r, err := NewRuntime(Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	// The version folder wazero made, replaced by a file: every read and
	// write of an entry fails (ENOTDIR), as root too.
	versions, _ := filepath.Glob(filepath.Join(dir, "wazero-*"))
	if len(versions) != 1 {
		t.Fatalf("cache folder holds %v, want one wazero-* folder", versions)
	}
	if err := os.Remove(versions[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(versions[0], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	module := []byte("\x00asm\x01\x00\x00\x00")
	for range 2 { // the second skips the disk cache
		c, err := r.Compile(context.Background(), module, NewPolicy())
		if err != nil {
			t.Fatalf("compile with an unusable cache: %v", err)
		}
		c.Close(context.Background())
	}
	if err := r.DiskCacheError(); err == nil {
		t.Error("DiskCacheError is nil after the cache failed")
	}
	if _, err := r.Inspect(context.Background(), module); err != nil {
		t.Errorf("inspect with an unusable cache: %v", err)
	}
}

// TestCompileErrorNotACancellation: a module wazero refuses is a compile
// error, not a cancellation: the cause was read after the compilation's
// context was cancelled, so every error matched context.Canceled, which
// the reloader reads as a server stopping.
func TestCompileErrorNotACancellation(t *testing.T) {
	r, err := NewRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	_, err = r.compileModule(ctx, rt, []byte("\x00asm\x01\x00\x00\x00\xff\xff"), 0)
	if err == nil {
		t.Fatal("a malformed module compiled")
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("compile error %q matches context.Canceled", err)
	}
}

// TestCustomSectionChangesCompileFromCache: a module rebuilt with nothing
// changed but a custom section (a version stamp, a manifest) is compiled
// from the cache, not from nothing (a Go plugin: seconds, 20 s of CPU
// under the race detector), and its custom sections still read as the
// module's. It compiled afresh before: wazero keys its cache on the bytes.
func TestCustomSectionChangesCompileFromCache(t *testing.T) {
	dir := t.TempDir()
	r, err := NewRuntime(Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	entries := func() int { // of wazero's half of the cache
		n := 0
		versions, _ := filepath.Glob(filepath.Join(dir, "wazero-*"))
		if len(versions) != 1 {
			t.Fatalf("cache folder holds %v, want one wazero-* folder", versions)
		}
		filepath.WalkDir(versions[0], func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	module, err := os.ReadFile("../examples/plugins/dist/counter.wasm")
	if err != nil {
		t.Fatal(err)
	}
	custom := func(wasm []byte, name, data string) []byte {
		content := appendULEB(nil, uint64(len(name)))
		content = append(append(content, name...), data...)
		out := appendULEB(append(slices.Clone(wasm), 0), uint64(len(content)))
		return append(out, content...)
	}
	var was int
	for i, wasm := range [][]byte{
		module,
		custom(module, "version", "2"),
		custom(custom(module, "version", "3"), "manifest", "{}"),
		custom(module, "marker", ""), // empty, as plugins.StatelessSection
	} {
		c, err := r.Compile(context.Background(), wasm, NewPolicy())
		if err != nil {
			t.Fatalf("compile %d: %v", i, err)
		}
		if i == 0 {
			was = entries()
		} else if n := entries(); n != was {
			t.Errorf("compile %d, changed only in custom sections: the cache holds %d entries, was %d", i, n, was)
		}
		if got, want := string(c.CustomSection("version")), map[int]string{1: "2", 2: "3"}[i]; got != want {
			t.Errorf("compile %d: custom section version = %q, want %q", i, got, want)
		}
		if i == 2 && c.CustomSection("manifest") == nil {
			t.Errorf("compile %d: no custom section manifest", i)
		}
		if i == 3 && c.CustomSection("marker") == nil {
			t.Errorf("compile %d: the empty custom section marker reads as absent", i)
		}
		c.Close(context.Background())
	}
}

// TestSplitCustomMalformed: splitCustom meets only modules the checker
// accepted, or entries of the checked-module cache; a malformed one (a
// custom section too short for its name) is passed on as it is, never a
// panic.
func TestSplitCustomMalformed(t *testing.T) {
	head := []byte("\x00asm\x01\x00\x00\x00")
	for _, wasm := range [][]byte{
		append(slices.Clone(head), 0, 0, 1, 0),       // an empty custom section, then a type section
		append(slices.Clone(head), 0, 1, 9),          // a name longer than its section
		append(slices.Clone(head), 0, 5, 1, 'a'),     // a section longer than the module
		append(slices.Clone(head), 0, 2, 0x80, 0x80), // a name length cut short
	} {
		if got, taken := splitCustom(wasm, false); !slices.Equal(got, wasm) || taken != nil {
			t.Errorf("splitCustom(% x) = % x, %v; want the bytes as they are", wasm, got, taken)
		}
	}
}

// TestCustomSectionNameNotUTF8Refused: a custom section whose name is not
// UTF-8 makes the module malformed (the spec's utf8-custom-section-id
// tests). The checker leaves names' encoding to wazero, so splitCustom
// must not take such a section out of wazero's sight: the module is
// refused, as it was before custom sections were split.
func TestCustomSectionNameNotUTF8Refused(t *testing.T) {
	r, err := NewRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	wasm := []byte("\x00asm\x01\x00\x00\x00\x00\x03\x01\xffx") // custom section "\xff", data "x"
	if _, err := CheckModule(wasm, ModuleLimits{}); err != nil {
		t.Fatalf("the checker refused it (%v): this test wants wazero's verdict", err)
	}
	c, err := r.Compile(context.Background(), wasm, NewPolicy())
	if err == nil {
		c.Close(context.Background())
		t.Fatal("a module whose custom section's name is not UTF-8 compiled")
	}
	if !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("refused for %v, want its name's encoding", err)
	}
}

// TestSplitCustomEmptyDebugSectionLeftLast: under wazero's interruption
// the DWARF sections stay in wazero's bytes, and wazero v1.12 refuses a
// module whose last section is a custom section it keeps with no data
// (its reader is at the end: "failed to read custom section
// name[.debug_x]: EOF"). An empty one followed by custom sections that
// splitCustom takes out must not be left last: the module compiled before
// custom sections were split.
func TestSplitCustomEmptyDebugSectionLeftLast(t *testing.T) {
	r, err := NewRuntime(Options{Interruption: InterruptWazero})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	wasm := []byte("\x00asm\x01\x00\x00\x00" +
		"\x00\x09\x08.debug_x" + // empty
		"\x00\x05\x03foo1")
	c, err := r.Compile(context.Background(), wasm, NewPolicy())
	if err != nil {
		t.Fatalf("a module ending in an empty DWARF section and a custom section: %v", err)
	}
	defer c.Close(context.Background())
	if got := string(c.CustomSection("foo")); got != "1" {
		t.Errorf("custom section foo reads %q, want %q", got, "1")
	}
}

// TestSourcesDigestIgnoresTests: the checked-module cache is keyed by the
// package's code as built, and a test file changes no check or rewriting
// (no test sets a hook of theirs). Each edit of a test file made a folder
// of entries anew in the tests' shared cache, 50 MB and more of Go plugins
// kept a week; a change of code still does.
func TestSourcesDigestIgnoresTests(t *testing.T) {
	files := fstest.MapFS{
		"check.go":      {Data: []byte("package sandbox\n")},
		"check_test.go": {Data: []byte("package sandbox\n")},
	}
	was := digestSources(files)
	files["check_test.go"] = &fstest.MapFile{Data: []byte("package sandbox\n\n// edited\n")}
	files["new_test.go"] = &fstest.MapFile{Data: []byte("package sandbox_test\n")}
	if got := digestSources(files); got != was {
		t.Error("an edit of the tests changed the digest of the sources")
	}
	files["check.go"] = &fstest.MapFile{Data: []byte("package sandbox\n\n// edited\n")}
	if got := digestSources(files); got == was {
		t.Error("an edit of the code left the digest of the sources as it was")
	}
}

// TestSourcesEmbeddedAreTheCode: what the package embeds for its digest
// is every Go file of its folder but the tests: one of the code left out
// would change the checker or the rewriter without changing the key of
// the checked-module cache, and the tests (counted by no digest) made
// some 0.3 MB of every binary.
func TestSourcesEmbeddedAreTheCode(t *testing.T) {
	onDisk, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	onDisk = slices.DeleteFunc(onDisk, func(n string) bool { return strings.HasSuffix(n, "_test.go") })
	embedded, err := fs.Glob(sources, "*")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(embedded)
	if !slices.Equal(embedded, onDisk) {
		t.Errorf("embedded for the digest: %v\nthe package's code: %v", embedded, onDisk)
	}
}

// TestSplitCustomManySectionsMemory: what splitCustom keeps of a module's
// custom sections is in proportion to their bytes, not their number. A
// hostile module of nothing but 3-byte custom sections (which the
// checker now refuses past MaxCustomSections) made it allocate some 78 times the module's
// size, a slice element and its growth for each: 5 GB for a module at the
// default 64 MiB limit, where wazero itself allocated under half of that.
func TestSplitCustomManySectionsMemory(t *testing.T) {
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	for len(wasm) < 4<<20 {
		wasm = append(wasm, 0, 1, 0) // a custom section named "", empty
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, taken := splitCustom(wasm, false)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(8*len(wasm)) {
		t.Errorf("splitCustom of a module of %d bytes allocated %d MB", len(wasm), got>>20)
	}
	runtime.KeepAlive(taken)
}
