package durable

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// A contained call X runs unchecked on a claim verified over 2 s ago;
// the store does not answer (the breaker open): its checkpoint fails with
// errUnverified (nothing written), and X ends with ErrOutcomeUnknown, its
// instance kept. A review found no note of the state not saved then: the
// instance, evicted for room, came back as the store's older state with
// no reset notice, while the claim answered X's idempotency key with X's
// result. Now the instance is noted as not saved, and its eviction says
// the state was reset.
func TestUnverifiedOutcomeUnknownThenEvictedIsNotSilent(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx

	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved

	// X: unchecked, with an at-most-once key.
	cx, lX, started := w.unchecked(w.p, "2")
	gotX := "2"
	ageClaim(c)
	d.downUntil.Store(int64(sinceBase() + breakerWindow)) // the store is away
	resX, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": gotX}}})
	why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, &Once{Key: "k1", Result: resX}, started)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("X: %q %v, want ErrOutcomeUnknown", why, err)
	}
	lX.Done(nil) // kept, as the host does

	// Another client's instance evicts alice's p for room.
	lb, err := w.ses.Acquire(ctx, sessions.Client("bob"), w.q)
	if err != nil {
		t.Fatal(err)
	}
	lb.Done(nil)

	// The store answers again; the client retries X with its key.
	d.downUntil.Store(0)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("retry: claim: %v %v", c2, err)
	}
	l := w.acquire(w.p)
	reset := l.Notice().Reset
	replay := d.Replay(c2, "k1")
	if replay != nil && reset == nil {
		// The host answers the retry from the replay: X "succeeded".
		got := w.count(l)
		l.Done(nil)
		t.Fatalf("retry of X answered with X's result (%s) and no reset notice, yet p's state lacks X: the next call counts %s, want 3", replay, got)
	}
	l.Done(nil)
}
