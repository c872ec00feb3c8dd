package plugins_test

import (
	"context"
	"sync"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestLoadSameBytesInParallel: one file served as several plugins (a
// configuration naming it twice, copies in a folder) is loaded in
// parallel. wazero v1.12 shares a module read from its file cache with the
// other compilations of the same bytes before it is ready; an instance
// then ran on it half made (a data race, under -race; at times a panic
// that ends the process). sandbox.Runtime serialises such compilations.
func TestLoadSameBytesInParallel(t *testing.T) {
	dir := t.TempDir()
	b := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	ctx := context.Background()
	for round := range 3 {
		// From round 1 on, the module comes from the file cache.
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				p, err := plugins.Load(ctx, rt, "same.wasm", b, plugins.Options{})
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				defer p.Close(ctx)
				inst, err := p.NewInstance(ctx)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				inst.Close(ctx)
			})
		}
		wg.Wait()
		rt.Close(ctx)
	}
}
