package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
)

// FuzzCheckModule feeds the pre-compile checker arbitrary bytes, seeded
// with the test plugins written in WebAssembly text. The checker must
// never panic; a module it accepts and wazero compiles still checks and
// compiles with its tables capped. Only what the checker accepts reaches
// wazero: wazero allocates what a module declares before reading it, and
// a fuzzed count of 2^32 items ends the fuzzing process. (That every
// plugin we build passes the checker is TestCheckModuleAcceptsPlugins.)
func FuzzCheckModule(f *testing.F) {
	addSmallPlugins(f, filepath.Join("..", "internal", "testplugins", "dist"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x04\x04\x01\x70\x00\x05")) // a table with no maximum
	f.Add(callsBadType)
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	f.Cleanup(func() { rt.Close(ctx) })
	limits := ModuleLimits{MaxNesting: 64, MaxBlocks: 256, MaxLoops: 64, MaxBrTableTargets: 256, MaxFunctionSize: 16 << 10, MaxTableSize: 1 << 10}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		c, err := checkModule(wasm, limits)
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) && (le.Value <= le.Max || le.Limit == "") {
				t.Fatalf("a LimitError within its limit: %v", err)
			}
			return
		}
		mod, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return
		}
		mod.Close(ctx)
		capped := c.capTables(wasm)
		if _, err := CheckModule(capped, limits); err != nil {
			t.Fatalf("the module with its tables capped does not check: %v", err)
		}
		mod, err = rt.CompileModule(ctx, capped)
		if err != nil {
			t.Fatalf("the module with its tables capped does not compile: %v", err)
		}
		mod.Close(ctx)
	})
}

// callsBadType is a module whose function 0 calls function 1, whose type
// index (5) is past the one type declared. wazero v1.12.0 validates the
// call before function 1's own type index, and panics.
var callsBadType = []byte("\x00asm\x01\x00\x00\x00" +
	"\x01\x04\x01\x60\x00\x00" + // one type: () -> ()
	"\x03\x03\x02\x00\x05" + // two functions, of types 0 and 5
	"\x0a\x09\x02\x04\x00\x10\x01\x0b\x02\x00\x0b") // call 1; nothing

// TestTypeIndexOutOfRange checks that the checker refuses a function whose
// type index is out of range, and that a panic in wazero's validator, were
// the checker to miss one, is a compile error and not the host's end.
func TestTypeIndexOutOfRange(t *testing.T) {
	if _, err := CheckModule(callsBadType, ModuleLimits{}); err == nil {
		t.Error("the checker accepted a function of type index 5 in a module of one type")
	} else {
		t.Logf("refused: %v", err)
	}
	imports := []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x02\x07\x01\x01m\x01f\x00\x01")
	if _, err := CheckModule(imports, ModuleLimits{}); err == nil {
		t.Error("the checker accepted an imported function of type index 1 in a module of one type")
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	if _, err := compileRecovered(ctx, rt, callsBadType); err == nil {
		t.Error("wazero compiled a module with a type index out of range")
	} else {
		t.Logf("compile: %v", err)
	}
}

// TestCheckModuleAcceptsPlugins checks every plugin the repository builds
// (Go wasip1 builds and WebAssembly text) against the default limits, and
// logs what the largest uses, for docs/SECURITY.md.
func TestCheckModuleAcceptsPlugins(t *testing.T) {
	files := builtPlugins(t)
	var most ModuleStats
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s, err := CheckModule(b, ModuleLimits{})
		if err != nil {
			t.Errorf("%s: %v", f, err)
		}
		most = ModuleStats{
			Size: max(most.Size, s.Size), Functions: max(most.Functions, s.Functions),
			MaxFunctionLen: max(most.MaxFunctionLen, s.MaxFunctionLen), MaxNesting: max(most.MaxNesting, s.MaxNesting),
			MaxBlocks: max(most.MaxBlocks, s.MaxBlocks), MaxLoops: max(most.MaxLoops, s.MaxLoops),
			MaxBrTable: max(most.MaxBrTable, s.MaxBrTable), MaxLocals: max(most.MaxLocals, s.MaxLocals),
			Tables: max(most.Tables, s.Tables), MaxTableMin: max(most.MaxTableMin, s.MaxTableMin),
			DataSegments: max(most.DataSegments, s.DataSegments), ElemSegments: max(most.ElemSegments, s.ElemSegments),
			CustomSections: max(most.CustomSections, s.CustomSections),
		}
	}
	t.Logf("the most any of %d plugins uses: %+v", len(files), most)
}

// builtPlugins lists every plugin the repository builds (the examples and
// the test plugins), skipping the test when none is built.
func builtPlugins(t *testing.T) []string {
	var files []string
	for _, dir := range []string{"../examples/plugins/dist", "../internal/testplugins/dist"} {
		f, _ := filepath.Glob(filepath.Join(dir, "*.wasm"))
		files = append(files, f...)
	}
	if len(files) == 0 {
		t.Skip("no plugins built: run `make plugins testplugins`")
	}
	return files
}

// addSmallPlugins adds the plugins under 64 KiB in each folder (the
// WebAssembly-text ones) to f's seeds.
func addSmallPlugins(f *testing.F, dirs ...string) {
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.wasm"))
		for _, s := range files {
			if b, err := os.ReadFile(s); err == nil && len(b) < 64<<10 {
				f.Add(b)
			}
		}
	}
}

// FuzzSplitCustom feeds splitCustom arbitrary bytes, which it must take
// without a panic, and the modules the checker accepts: wazero, as
// Compile configures it, must take the split module whenever it took the
// whole one, and each custom section must read the same, the first of
// its name, from what splitCustom took out and then from wazero's module,
// as Compile's CustomSection reads it, as from the whole module.
//
// The split module may compile where the whole did not only when the
// whole is valid with its custom sections skipped (their names' encoding
// and bounds still checked): wazero v1.12 refuses a module whose last
// section is a custom section it keeps, with no data ("failed to read
// custom section name[x]: EOF": its bytes.Reader reads nothing at the
// end), and such a section taken out no longer fails the module.
func FuzzSplitCustom(f *testing.F) {
	addSmallPlugins(f, filepath.Join("..", "internal", "testplugins", "dist"))
	head := "\x00asm\x01\x00\x00\x00"
	f.Add([]byte(head + "\x00\x03\x01ax\x01\x04\x01\x60\x00\x00\x00\x02\x01b\x00\x02\x01a")) // a, type, b, a again
	f.Add([]byte(head + "\x00\x03\x01\xffx"))                                                // a name not UTF-8
	f.Add([]byte(head + "\x00\x06\x04name\x00\x08\x07.debug_\x00\x01\x00"))                  // name, a DWARF one, an empty name
	f.Add([]byte(head + "\x00\x09\x08.debug_x\x00\x05\x03foo1"))                             // an empty DWARF one, then another
	ctx := context.Background()
	// The interpreter validates as the compiler does, faster.
	interp := wazero.NewRuntimeConfigInterpreter
	skip := wazero.NewRuntimeWithConfig(ctx, interp().WithCustomSections(false).WithDebugInfoEnabled(false))
	asCompile := map[bool]wazero.Runtime{}
	for _, debug := range []bool{false, true} {
		asCompile[debug] = wazero.NewRuntimeWithConfig(ctx, interp().WithCustomSections(true).WithDebugInfoEnabled(debug))
	}
	f.Cleanup(func() {
		for _, rt := range []wazero.Runtime{skip, asCompile[false], asCompile[true]} {
			rt.Close(ctx)
		}
	})
	limits := ModuleLimits{MaxNesting: 64, MaxBlocks: 256, MaxLoops: 64, MaxBrTableTargets: 256, MaxFunctionSize: 16 << 10, MaxTableSize: 1 << 10}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		for _, debug := range []bool{false, true} {
			splitCustom(wasm, debug)
		}
		// Only what the checker accepts reaches wazero, which allocates
		// what a module declares (see FuzzCheckModule).
		if _, err := checkModule(wasm, limits); err != nil {
			return
		}
		mod, valid := skip.CompileModule(ctx, wasm)
		if valid == nil {
			mod.Close(ctx)
		}
		for _, debug := range []bool{false, true} {
			whole, werr := asCompile[debug].CompileModule(ctx, wasm)
			if werr == nil {
				defer whole.Close(ctx)
			}
			out, taken := splitCustom(wasm, debug)
			if taken == nil && !bytes.Equal(out, wasm) {
				t.Fatalf("debug %v: nothing taken, yet the bytes changed", debug)
			}
			var names []string // of the sections taken, then of those kept
			taken.each(func(name, _ []byte) bool {
				names = append(names, string(name))
				return true
			})
			for _, n := range names {
				if n == "name" || (debug && strings.HasPrefix(n, ".debug_")) {
					t.Fatalf("debug %v: custom section %q taken out", debug, n)
				}
			}
			split, err := asCompile[debug].CompileModule(ctx, out)
			if (werr == nil && err != nil) || (werr != nil && err == nil && valid != nil) {
				t.Fatalf("debug %v: the module compiles: %v; split: %v; with its custom sections skipped: %v", debug, werr, err, valid)
			}
			if err != nil {
				continue
			}
			defer split.Close(ctx)
			if werr != nil {
				continue
			}
			c := &Compiled{mod: split, customs: taken}
			for _, s := range whole.CustomSections() {
				if got, want := c.CustomSection(s.Name()), firstCustom(whole, s.Name()); !slices.Equal(got, want) || (got == nil) != (want == nil) {
					t.Fatalf("debug %v: custom section %q reads %q, want %q", debug, s.Name(), got, want)
				}
			}
			for _, s := range split.CustomSections() {
				names = append(names, s.Name())
			}
			for _, n := range names {
				if firstCustom(whole, n) == nil {
					t.Fatalf("debug %v: custom section %q is not the module's", debug, n)
				}
			}
		}
	})
}

func firstCustom(mod wazero.CompiledModule, name string) []byte {
	for _, s := range mod.CustomSections() {
		if s.Name() == name {
			return s.Data()
		}
	}
	return nil
}

// FuzzDecodeChecked feeds decodeChecked arbitrary entries of the
// checked-module cache, with their digest made to match (else hardly
// any input would get past it): a torn or hostile file must be refused
// or read without a panic, and what is read encodes to an entry that
// reads the same.
func FuzzDecodeChecked(f *testing.F) {
	f.Add([]byte{})
	for _, c := range []*checked{
		{wasm: []byte("\x00asm\x01\x00\x00\x00")},
		{wasm: []byte("\x00asm\x01\x00\x00\x00\x00\x02\x01a"), snap: checkedSnap{Globals: []string{"g", globalExportPrefix + "1"}, HasStart: true}},
		{wasm: []byte("\x00asm\x01\x00\x00\x00"), snap: checkedSnap{Refusal: "it imports a mutable global"}},
	} {
		b := encodeChecked(c)
		f.Add(b[:len(b)-sha256.Size])
	}
	meta := `{"globals":[],"refusal":null}` // as encodeChecked writes none
	f.Add([]byte(checkedMagic + string([]byte{byte(len(meta)), 0, 0, 0}) + meta + "\x00asm\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		decodeChecked(body)
		sum := sha256.Sum256(body)
		c, err := decodeChecked(append(slices.Clip(body), sum[:]...))
		if err != nil {
			return
		}
		if checkHeader(c.wasm) != nil {
			t.Fatalf("an entry of bytes % x read", c.wasm)
		}
		again, err := decodeChecked(encodeChecked(c))
		if err != nil {
			t.Fatalf("an entry read encodes to one refused: %v", err)
		}
		// No globals read as nil or empty alike: only their number and
		// names count.
		if !bytes.Equal(again.wasm, c.wasm) || again.snap.Refusal != c.snap.Refusal || again.snap.HasStart != c.snap.HasStart || !slices.Equal(again.snap.Globals, c.snap.Globals) {
			t.Fatalf("an entry read as %+v reads again as %+v", c.snap, again.snap)
		}
	})
}
