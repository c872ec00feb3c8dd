package durable

import (
	"encoding/json"
	"errors"
	"testing"
)

// A review of stop 64's fixes: a contained call X whose checkpoint fails with
// errUnverified (breaker open, claim verified > 2 s ago) ends with
// ErrOutcomeUnknown through AfterUncheckedCall, its instance KEPT (it holds
// X's effect, noted unsaved for the heartbeat). ErrOutcomeUnknown tells the
// client to retry with the same idempotency key "to be answered with its
// result if it was" kept. Since checkpoint keeps the key only via keep(),
// and the errUnverified branch returns before keep(), the key is gone: the
// retry runs X a second time on the instance that already has X's effect.
func TestOutcomeUnknownRetryNotRunTwice(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved

	cx, lX, started := w.unchecked(w.p, "2") // X: p counts 2
	ageClaim(c)
	d.downUntil.Store(int64(sinceBase() + breakerWindow)) // the store is away
	resX, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": "2"}}})
	why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, &Once{Key: "k1", Result: resX}, started)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("X: %q %v, want ErrOutcomeUnknown", why, err)
	}
	lX.Done(nil) // instance kept, as the host does

	d.downUntil.Store(0) // store answers; client retries X with key k1
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("retry: claim: %v %v", c2, err)
	}
	if r := d.Replay(c2, "k1"); r == nil {
		l := w.acquire(w.p)
		got := w.count(l) // the host runs X again
		l.Done(nil)
		t.Fatalf("retry of X (ErrOutcomeUnknown, instance kept with X's effect) is not answered from its key: it runs again and counts %s (X applied twice; want replay of \"2\")", got)
	}
}
