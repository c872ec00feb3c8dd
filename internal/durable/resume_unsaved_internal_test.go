package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// unsavedThenEvicted runs alice's p to 3 (saved), then to 4 with its
// checkpoint refused by an open breaker (unsaved, the claim not dirty),
// and then evicts it for bob's q. The breaker is closed again after.
func unsavedThenEvicted(t *testing.T, w *lossyWorld, c *Claim) {
	t.Helper()
	unsavedThenEvictedBy(t, w, c, func() {
		w.d.downUntil.Store(int64(sinceBase() + breakerWindow)) // the store is away
	})
}

// unsavedThenEvictedBy is unsavedThenEvicted with the checkpoint of 4
// failed by fail, made just before it: an open breaker, or a write that
// gets no answer (the claim dirty).
func unsavedThenEvictedBy(t *testing.T, w *lossyWorld, c *Claim, fail func()) {
	t.Helper()
	unsavedWith(t, w, c, fail, nil)
}

// unsavedWith is unsavedThenEvictedBy for a call of 4 with an
// idempotency key, first (nil: none).
func unsavedWith(t *testing.T, w *lossyWorld, c *Claim, fail func(), first *Once) {
	t.Helper()
	d, ctx := w.d, w.ctx
	for range 3 {
		w.callSaved(c, w.p)
	}
	l := w.acquire(w.p)
	if got := w.count(l); got != "4" {
		t.Fatalf("count %s, want 4", got)
	}
	fail()
	if why, _ := d.AfterCall(ctx, w.key, c, l, first); why == "" {
		t.Fatal("the checkpoint that failed says it saved")
	}
	l.Done(nil)
	lb, err := w.ses.Acquire(ctx, sessions.Client("bob"), w.q)
	if err != nil {
		t.Fatal(err)
	}
	lb.Done(nil)
	if w.ses.Holds(w.key, w.p.Name()) {
		t.Fatal("alice's p not evicted")
	}
	d.downUntil.Store(0) // the store answers again
}

func TestEvictedUnsavedLostAfterResume(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	unsavedThenEvicted(t, w, c)
	d.forget(w.key, c) // another call could be neither saved nor verified
	w.claim()          // take: resumable, resume
	if err := d.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	ses := sessions.New(nil)
	t.Cleanup(func() { ses.Close(ctx) })
	b := New(Options{Store: w.st.Store, Sessions: ses, Replica: "b"})
	if _, err := b.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	lb, err := ses.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Done(nil)
	if got, reset := w.count(lb), lb.Notice().Reset; reset == nil || got != "1" {
		t.Fatalf("replica b counts %s (reset %+v); want 1, reset not-saved: 4 was answered and lost", got, reset)
	}
}
