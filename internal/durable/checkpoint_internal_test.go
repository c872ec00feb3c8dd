package durable

import (
	"context"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A checkpoint whose snapshot failed as it ran out of time saves nothing, but the call
// it follows was answered: its at-most-once key is kept (a retry gets its
// result, not a second run), and the plugin is marked unsaved (an
// eviction then says stateReset, not the store's older state). The old
// code returned before either.
func TestCheckpointOutOfTimeKeepsKeyAndMarksUnsaved(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	path := testplugins.Example(t, "counter")
	p, err := plugins.Load(ctx, rt, path, testplugins.Bytes(t, path), plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	inst, err := p.NewInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ses := sessions.New(&sessions.Options{})
	defer ses.Close(ctx)
	d := New(Options{Store: statestore.NewMemory(), Sessions: ses, Replica: "a"})
	key := sessions.Client("alice")
	c, err := d.BeforeCall(ctx, key)
	if err != nil || c == nil {
		t.Fatalf("claim: %v, %v", c, err)
	}
	// Out of time, and a snapshot that fails (the instance closed stands
	// for a snapshot cut short by the deadline).
	gone, cancel := context.WithCancel(ctx)
	cancel()
	inst.Close(ctx)
	why, err := d.checkpoint(gone, c, p, inst, c.seeded, &Once{Key: "k1", Result: []byte(`{"content":[]}`)}, time.Time{})
	if why != NotSavedUnavailable || err == nil {
		t.Fatalf("checkpoint out of time: %q, %v; want %q and an error", why, err, NotSavedUnavailable)
	}
	if got := string(d.Replay(c, "k1")); got != `{"content":[]}` {
		t.Errorf("replay of the call's key: %q; want its result", got)
	}
	if u := c.unsaved[p.Name()]; u != NotSavedUnavailable {
		t.Errorf("the plugin is marked %q, want %q", u, NotSavedUnavailable)
	}
}
