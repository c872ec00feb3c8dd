package durable

import (
	"errors"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
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
	cx, lX, started := w.unchecked(w.p, "2")
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
	if got, _ := w.claimedCall(w.p); got != "4" {
		t.Fatalf("X again counts %s, want 4", got)
	}
	// Y, a current instance under a verified claim, is saved.
	why, err := d.AfterCall(ctx, w.key, cy, lY, nil)
	lY.Done(err)
	if err != nil || why != "" {
		t.Fatalf("Y's checkpoint: %q %v; want saved (nothing moved while Y ran)", why, err)
	}
}

// unchecked runs p's counter as the host runs a contained call, before
// its claim is checked (CheckLater), and wants it to count want. It
// returns the claim, the lease (not done) and when the call started.
func (w *lossyWorld) unchecked(p *plugins.Plugin, want string) (*Claim, *sessions.Lease, time.Time) {
	w.t.Helper()
	started := time.Now()
	c := w.d.CheckLater(w.key)
	if c == nil {
		w.t.Fatal("CheckLater: no claim")
	}
	l := w.acquire(p)
	if got := w.count(l); got != want {
		w.t.Fatalf("an unchecked call of %s counts %s, want %s", p.Name(), got, want)
	}
	return c, l, started
}

// claimedCall runs p's counter claimed first (BeforeCall) and saved
// (AfterCall), and returns the count sent and the lease's reset notice.
func (w *lossyWorld) claimedCall(p *plugins.Plugin) (string, *sessions.Reset) {
	w.t.Helper()
	c, err := w.d.BeforeCall(w.ctx, w.key)
	if err != nil || c == nil {
		w.t.Fatalf("claim: %v %v", c, err)
	}
	l := w.acquire(p)
	got := w.count(l)
	reset := l.Notice().Reset
	why, err := w.d.AfterCall(w.ctx, w.key, c, l, nil)
	l.Done(err)
	if err != nil {
		w.t.Fatalf("checkpoint of %s: %q %v", p.Name(), why, err)
	}
	return got, reset
}
