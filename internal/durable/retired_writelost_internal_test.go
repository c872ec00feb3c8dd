package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// A retired claim (forgotten, then taken again by this replica under the
// same fence) still holds its not-saved notes (retireTaking clones them),
// and a heartbeat round that began before the retirement (sweep's
// snapshot of claims) may reach it: writeLost writes nothing for it. A
// review found it writing "lost" over the state the new claim saved
// since, under the same fence.
func TestRetiredClaimWriteLostOverwritesNewState(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	unsavedThenEvicted(t, w, c)
	snapshot := []*claimOf{{w.key, c}} // sweep's list, taken before the retirement
	d.forget(w.key, c)
	c2 := w.claim() // take: resume; c is retired
	l := w.acquire(w.p)
	if got, reset := w.count(l), l.Notice().Reset; got != "1" || reset == nil || reset.Reason != ReasonNotSaved {
		t.Fatalf("after resume: count %s (reset %+v), want 1, reset not-saved", got, reset)
	}
	if why, err := d.AfterCall(ctx, w.key, c2, l, nil); why != "" || err != nil {
		t.Fatalf("checkpoint of 1: %q %v", why, err)
	}
	l.Done(nil)
	lb, err := w.ses.Acquire(ctx, sessions.Client("bob"), w.q) // evicts alice's p again
	if err != nil {
		t.Fatal(err)
	}
	lb.Done(nil)
	d.renewAll(snapshot) // the heartbeat round that began before the retirement
	l = w.acquire(w.p)
	defer l.Done(nil)
	// The reset is said again (the call that said it first may have
	// answered no one: unsaidOf), but nothing is lost.
	if got, reset := w.count(l), l.Notice().Reset; got != "2" || (reset != nil && reset.Reason != ReasonNotSaved) {
		t.Fatalf("after the retired claim's resave: count %s (reset %+v); want 2, at most the reset said again: 1 was saved by the current claim", got, reset)
	}
}
