package sandbox

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
)

// TestMergeDataSameMemory: for every plugin the repository builds, the
// module with its data segments merged leaves the same memory at
// instantiation as the module as built, and has fewer segments where it
// had many (Go's).
func TestMergeDataSameMemory(t *testing.T) {
	files := builtPlugins(t)
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	if err := defineHost(ctx, rt); err != nil {
		t.Fatal(err)
	}
	memory := func(wasm []byte) ([]byte, error) {
		mod, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return nil, err
		}
		defer mod.Close(ctx)
		m, err := rt.InstantiateModule(ctx, mod, wazero.NewModuleConfig().WithName("").WithStartFunctions())
		if err != nil {
			return nil, err
		}
		defer m.Close(ctx)
		b, _ := m.Memory().Read(0, m.Memory().Size())
		return bytes.Clone(b), nil
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			wasm, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			c, err := checkModule(wasm, ModuleLimits{})
			if err != nil || c.snap.hasStart {
				t.Skip("not a module this test instantiates (refused, or has a start function)")
			}
			merged := c.mergeData(wasm)
			after, err := checkModule(merged, ModuleLimits{})
			if err != nil {
				t.Fatalf("the merged module does not check: %v", err)
			}
			if len(c.data.segs) > 1000 && len(after.data.segs)*10 > len(c.data.segs) {
				t.Errorf("%d segments merged into %d", len(c.data.segs), len(after.data.segs))
			}
			t.Logf("%d segments, %d after merging; %d bytes, %d after", len(c.data.segs), len(after.data.segs), len(wasm), len(merged))
			want, err := memory(wasm)
			if err != nil {
				t.Skipf("the module as built does not instantiate here: %v", err)
			}
			got, err := memory(merged)
			if err != nil {
				t.Fatalf("the merged module: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Error("the merged module's memory differs")
			}
		})
	}
}

// TestMergeDataSmall: segments out of order, with gaps, become one; an
// overlap, a passive segment or a memory.init leaves the module as it is.
func TestMergeDataSmall(t *testing.T) {
	head := "\x00asm\x01\x00\x00\x00\x05\x03\x01\x00\x01"
	tests := []struct {
		name   string
		data   string
		merged bool
	}{
		{"gaps, out of order", "\x0b\x16\x03\x00\x41\x10\x0b\x02ab\x00\x41\x00\x0b\x02cd\x00\x41\x20\x0b\x02ef", true},
		{"overlap", "\x0b\x0f\x02\x00\x41\x00\x0b\x02ab\x00\x41\x01\x0b\x02cd", false},
		{"passive", "\x0b\x0c\x02\x01\x02ab\x00\x41\x00\x0b\x02cd", false},
		{"one segment", "\x0b\x08\x01\x00\x41\x10\x0b\x02ab", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wasm := []byte(head + tt.data)
			c, err := checkModule(wasm, ModuleLimits{})
			if err != nil {
				t.Fatal(err)
			}
			out := c.mergeData(wasm)
			if merged := !bytes.Equal(out, wasm); merged != tt.merged {
				t.Fatalf("merged: %v, want %v", merged, tt.merged)
			}
			after, err := checkModule(out, ModuleLimits{})
			if err != nil {
				t.Fatalf("the rewritten module does not check: %v", err)
			}
			if tt.merged && len(after.data.segs) != 1 {
				t.Errorf("%d segments after merging, want 1", len(after.data.segs))
			}
		})
	}
}
