package statestore_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// Issue #25, finding 13: a state key file is made whole or not at all.
// Replicas (or a replica and `wasmtools` run beside it) starting at once
// on a fresh volume all get the same key, never a half-written file read
// as "too short" or a second key; nothing temporary is left behind. The
// old code created the file, then wrote it: a reader in between got an
// empty key.
func TestKeyFileMadeWhole(t *testing.T) {
	for round := range 100 {
		dir := t.TempDir()
		path := filepath.Join(dir, "sub", "state.key")
		const n = 8
		keys := make([][]byte, n)
		errs := make([]error, n)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range n {
			wg.Go(func() {
				start.Wait()
				keys[i], errs[i] = statestore.KeyFile(path)
			})
		}
		start.Done()
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: caller %d: %v", round, i, errs[i])
			}
			if string(keys[i]) != string(keys[0]) || len(keys[i]) != 64 {
				t.Fatalf("round %d: callers got %q and %q; want one 64-digit key", round, keys[0], keys[i])
			}
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("round %d: key file %v, %v; want mode 0600", round, st, err)
		}
		if left, _ := os.ReadDir(filepath.Dir(path)); len(left) != 1 {
			t.Fatalf("round %d: %d files beside the key; want none", round, len(left)-1)
		}
	}
}
