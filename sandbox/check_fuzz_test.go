package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
