package durable

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestResetSaidAgainAfterKilledReplica: alice's p is reset at
// replica a (here: 4 not saved, then evicted: stateReset not-saved; a
// store-lost reset is the same). Her next call, with an idempotency key,
// runs on the fresh instance (count 1) and is checkpointed with its first
// result, which the host makes from the guest's output (toMCP(out), in
// host.checkpoint) before shapeResult adds the lease's stateReset. The
// lease is done: the notice is consumed. a is then killed before the
// response reaches the client (the fault suite's kill9-after-checkpoint).
// The client's retry, same key, reaches b: b replays the first result,
// which carries no stateReset, and b's lease carries none either (the
// record's state had no Unsaid: the lease did not KeepNotice). The client
// went from 3 (saved, acknowledged) to 1 and was never told (a review).
// Now every call whose lease carries a reset records it with the state
// (unsaidOf), and the host keeps the reset in the result it saves for a
// replay (host.checkpoint).
func TestResetSaidAgainAfterKilledReplica(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	unsavedThenEvictedBy(t, w, c, func() { w.st.losePut.Store(true) })
	// The client's call K at a.
	c, err := d.BeforeCall(ctx, w.key)
	if err != nil || c == nil {
		t.Fatalf("a: claim %v %v", c, err)
	}
	l := w.acquire(w.p)
	reset := l.Notice().Reset
	if reset == nil {
		t.Fatal("a's lease carries no reset; the test's premise is wrong")
	}
	got := w.count(l)
	// As host.checkpoint stores it: the guest's result, no _meta.
	first := &Once{Key: "k:after-reset", Result: json.RawMessage(`{"content":[{"type":"text","text":"` + got + `"}]}`)}
	if why, err := d.AfterCall(ctx, w.key, c, l, first); err != nil || why != "" {
		t.Fatalf("a: checkpoint %q %v", why, err)
	}
	l.Done(nil) // the response (with stateReset) is written... and a is killed
	// The retry at b.
	bSes := sessions.New(nil)
	t.Cleanup(func() { bSes.Close(ctx) })
	b := New(Options{Store: w.st.Store, Sessions: bSes, Replica: "b"})
	bc, err := b.BeforeCall(ctx, w.key)
	if err != nil || bc == nil {
		t.Fatalf("b: claim %v %v", bc, err)
	}
	lb, err := bSes.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	replay := b.Replay(bc, first.Key)
	breset := lb.Notice().Reset
	lb.Done(nil)
	t.Logf("a counted %s (reset %q); b replays %s, b's lease reset %+v", got, reset.Reason, replay, breset)
	if replay == nil {
		t.Fatal("b does not know the key (not the finding)")
	}
	if breset == nil && !strings.Contains(string(replay), "stateReset") {
		t.Errorf("the client's retry is answered %s with no stateReset: its state went from 3 (saved) to %s unsaid", replay, got)
	}
}
