package durable

import (
	"errors"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// A contained call X of plugin p runs unchecked on a's stale
// instance (b served the session since); meanwhile a checked call Y of
// plugin q of the same session claims first (verify: the record read
// again, the session re-seeded under a's new fence) and runs on a current
// instance. X's checkpoint finds its instance's fence old: errMoved, and
// afterCall forgot the claim, though the claim is current (Y just
// verified it). X's run again (BeforeCall) then takes the session anew,
// retiring that claim, and Y's checkpoint, of a current instance under a
// verified claim, failed as moved (a review found it): the client of Y
// was told "the session moved to another replica while this call ran"
// though nothing moved. Only the instance is stale (errStaleInstance):
// the claim is kept.
func TestStaleUncheckedCallLeavesConcurrentCallAlone(t *testing.T) {
	w := newTwoReplicas(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p)                 // p: 1 at a
	w.callSaved(c, w.q)                 // q: 1 at a
	if got := w.bCalls(2); got != "3" { // b takes the session over: p 3
		t.Fatalf("b counts %s, want 3", got)
	}
	// X: p at a, unchecked, on a's stale instance.
	started := time.Now()
	cx := d.CheckLater(w.key)
	if cx == nil {
		t.Fatal("CheckLater: no claim")
	}
	lX := w.acquire(w.p)
	if got := w.count(lX); got != "2" {
		t.Fatalf("X on a's stale instance counts %s, want 2 (stale)", got)
	}
	// Y: q at a, claimed first: the record is read again.
	cy, err := d.BeforeCall(ctx, w.key)
	if err != nil || cy == nil {
		t.Fatalf("Y: claim: %v %v", cy, err)
	}
	lY := w.acquire(w.q)
	if got := w.count(lY); got != "2" {
		t.Fatalf("Y counts %s, want 2", got)
	}
	// X is found stale, as it should be, and runs again, claimed first.
	if _, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, nil, started); !errors.Is(err, ErrRunAgain) {
		t.Fatalf("X's check: %v, want ErrRunAgain", err)
	}
	lX.Done(sessions.ErrMoved)
	cx2, err := d.BeforeCall(ctx, w.key)
	if err != nil || cx2 == nil {
		t.Fatalf("X again: claim: %v %v", cx2, err)
	}
	lX2 := w.acquire(w.p)
	if got := w.count(lX2); got != "4" {
		t.Fatalf("X again counts %s, want 4", got)
	}
	if _, err := d.AfterCall(ctx, w.key, cx2, lX2, nil); err != nil {
		t.Fatalf("X again: checkpoint: %v", err)
	}
	lX2.Done(nil)
	// Y, a current instance under a verified claim, is saved.
	why, err := d.AfterCall(ctx, w.key, cy, lY, nil)
	lY.Done(err)
	if err != nil || why != "" {
		t.Fatalf("Y's checkpoint: %q %v; want saved (nothing moved while Y ran)", why, err)
	}
}
