package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// A session another replica took over is not a drain's failure: a
// checkpoint fenced there is errMoved, which Drain skips, and so is
// writeLost's write of a lost state fenced there. A review found
// writeLost returning the store's ErrFenced as it was, which Drain
// reported as its error (and the heartbeat's resave retried and warned
// every round until the client ended here).
func TestDrainMovedSessionWithLostStateNoError(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	unsavedThenEvicted(t, w, w.claim())
	// Replica b takes the session over.
	ses := sessions.New(nil)
	t.Cleanup(func() { ses.Close(ctx) })
	b := New(Options{Store: w.st.Store, Sessions: ses, Replica: "b"})
	if _, err := b.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	if err := d.Drain(ctx); err != nil {
		t.Fatalf("drain of a session another replica took over: %v", err)
	}
}
