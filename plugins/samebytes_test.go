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
// then ran on it half made (a data race, which -race reports here without
// sandbox.Runtime's serialisation; at times a panic that ends the
// process).
func TestLoadSameBytesInParallel(t *testing.T) {
	b := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	ctx := context.Background()
	for round := range 5 {
		rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
		if err != nil {
			t.Fatal(err)
		}
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			loaded []*plugins.Plugin
		)
		for i := range 6 {
			wg.Go(func() {
				// Each under its own policy, as a configuration gives.
				pol := sandbox.NewPolicy().WithMemoryLimit(uint64(64+16*i) << 20).WithEnv(map[string]string{"N": "v"})
				p, err := plugins.Load(ctx, rt, "same.wasm", b, plugins.Options{Policy: &pol})
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				mu.Lock()
				loaded = append(loaded, p)
				mu.Unlock()
				inst, err := p.NewInstance(ctx)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				inst.Close(ctx)
			})
		}
		wg.Wait()
		// Closed at the end: a round's modules stay in wazero's memory
		// while the next round reads the same bytes from its file.
		t.Cleanup(func() {
			for _, p := range loaded {
				p.Close(ctx)
			}
			rt.Close(ctx)
		})
	}
}
