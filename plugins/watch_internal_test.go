package plugins

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestWatchSeesFileAddedBeforeWatchBegan: a plugin file that appears
// after the first load read the folder and before its watch was set up
// (a deploy during the server's start) is served: no event will come for
// it, so without a rescan once watched it stayed unserved until another
// file of the folder changed.
func TestWatchSeesFileAddedBeforeWatchBegan(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	r := NewReloader(testplugins.Runtime(t), ReloaderOptions{Paths: []string{dir}})
	defer r.Close(context.Background())
	r.Load(ctx)
	swapped := make(chan struct{}, 1)
	r.OnSwap(func(ctx context.Context, s Swap) { // adds only: nothing to close
		select {
		case swapped <- struct{}{}:
		default:
		}
	})
	hash := testplugins.Bytes(t, testplugins.Example(t, "hash"))
	watchHook = func() {
		if err := os.WriteFile(filepath.Join(dir, "hash.wasm"), hash, 0o644); err != nil {
			t.Error(err)
		}
	}
	defer func() { watchHook = nil }()
	done := make(chan struct{})
	go func() { r.Watch(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-swapped:
	case <-time.After(time.Minute):
		t.Fatalf("the file added before the watch began is not served (status %+v)", r.Status())
	}
	if n := len(r.Catalogue().Plugins()); n != 1 {
		t.Errorf("%d plugins served, want hash", n)
	}
}
