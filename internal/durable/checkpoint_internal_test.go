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
	why, err := d.checkpoint(gone, c, p, inst, c.seeded, &Once{Key: "k1", Result: []byte(`{"content":[]}`)}, time.Time{}, "")
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

// An after-call checkpoint writes under a context only its deadline ends
// (statestore.Detach), so that a Redis store runs its exchange on the
// caller's goroutine; the claim's write under the request's context does
// not. With a plain context.WithTimeout anywhere between the checkpoint
// and the store (the bounded wrapper, say), the write is attached again.
func TestCheckpointWritesUnderDeadlineOnlyContext(t *testing.T) {
	w := newLossyWorld(t)
	c := w.claim()
	claimed := w.st.attached.Load()
	if w.st.detached.Load() != 0 {
		t.Fatalf("the claim wrote %d times under a detached context", w.st.detached.Load())
	}
	w.callSaved(c, w.p)
	if got := w.st.detached.Load(); got == 0 {
		t.Fatal("the checkpoint wrote nothing under a detached context")
	}
	if got := w.st.attached.Load(); got != claimed {
		t.Fatalf("the checkpoint wrote %d times under a context that could be cancelled", got-claimed)
	}
}
