package durable

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestUnverifiedCallKeyNotReplayedAfterResume: a keyed call (K2) whose
// checkpoint could be neither saved nor verified fails with errUnverified
// ("its effect was not kept: call the tool again"), and its instance is
// dropped. checkpoint remembered K2's first result in c.done before the
// write failed. The plugin had an earlier unsaved state (its checkpoint got
// no answer), so when the session's next request takes it again and resumes
// the forgotten claim (no one claimed since), resume copies c.done of every
// unsaved plugin, K2's result included. The client's retry with the same
// key is then answered with the first result ("3"), though that call's
// effect is in neither the store nor any instance: an acknowledged write
// lost (the fresh instance counts 1 next).
//
// Replay of K2 must be nil (the retry runs): until stop 64 (a review)
// the result was replayed.
func TestUnverifiedCallKeyNotReplayedAfterResume(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) { unverifiedCallKeyNotReplayed(t, backend) })
	}
}

func unverifiedCallKeyNotReplayed(t *testing.T, backend string) {
	w := newLossyWorld(t)
	if backend == "redis" {
		r, err := statestore.NewRedis("redis://" + proxytest.StartRedis(t) + "/0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		statestore.SetLease(r, 0)
		w.st.Store = r
	}
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved
	// p: 2 (key K1); its checkpoint gets no answer: acknowledged, notSaved.
	l := w.acquire(w.p)
	if got := w.count(l); got != "2" {
		t.Fatalf("p: %s", got)
	}
	w.st.losePut.Store(true)
	k1 := &Once{Key: "k:K1", Result: json.RawMessage(`{"content":[{"type":"text","text":"2"}]}`)}
	if why, err := d.AfterCall(ctx, w.key, c, l, k1); err != nil || why != NotSavedUnavailable {
		t.Fatalf("K1: %q %v", why, err)
	}
	l.Done(nil)
	d.downUntil.Store(0) // the store answers again
	// p: 3 (key K2), claimed and verified first ...
	if c2, err := d.BeforeCall(ctx, w.key); err != nil || c2 != c {
		t.Fatalf("claim for K2: %v %v", c2, err)
	}
	l = w.acquire(w.p)
	if got := w.count(l); got != "3" {
		t.Fatalf("p: %s", got)
	}
	// ... then the store goes away while it runs, past memoryGrace.
	w.st.down.Store(true)
	d.downUntil.Store(int64(sinceBase() + breakerWindow))
	ageClaim(c)
	k2 := &Once{Key: "k:K2", Result: json.RawMessage(`{"content":[{"type":"text","text":"3"}]}`)}
	if _, err := d.AfterCall(ctx, w.key, c, l, k2); !errors.Is(err, errUnverified) {
		t.Fatalf("K2: want errUnverified, got %v", err)
	}
	l.Done(sessions.ErrMoved) // the call failed (host/call.go): its instance goes
	// The store is back; the client retries K2 with the same key.
	w.st.down.Store(false)
	d.downUntil.Store(0)
	c3, err := d.BeforeCall(ctx, w.key)
	if err != nil || c3 == nil {
		t.Fatalf("claim after the outage: %v %v", c3, err)
	}
	if r := d.Replay(c3, "k:K2"); r != nil {
		l = w.acquire(w.p)
		got, reset := w.count(l), l.Notice().Reset
		l.Done(nil)
		t.Fatalf("the retry of K2, a call that failed as not kept (errUnverified), is answered from its first run %s; p's next call counts %s (reset %+v): the acknowledged 3 is lost", r, got, reset)
	}
}

// TestLostHereCallKeyNotReplayed: the same flaw on the path of
// TestPausedReplicaDoesNotWriteBackOverLostRecord. Replica a is stopped
// in a contained call X of p that carries key KX; b serves the session;
// the store loses the record; a is continued and X's write meets the
// loss: X fails with errLostHere ("its effect was not kept ... the plugin
// starts afresh"), and its instance goes. But checkpoint had remembered
// KX's first result before the write, and lostWithStore wrote it into
// the record's lost entry for p (pluginRecord.Done): the client's retry
// of X with the same key, at a or at b, is answered "2 saved", from a
// fresh instance that never ran it.
//
// Replay of KX must be nil at a and at b: until stop 64 (a review) both
// answered it.
func TestLostHereCallKeyNotReplayed(t *testing.T) {
	w := newTwoReplicas(t)
	ctx := w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // a: p 1, saved
	cx, lX, started := w.unchecked(w.p, "2")
	if got := w.bCalls(2); got != "3" { // a stopped; b serves
		t.Fatalf("b counts %s, want 3", got)
	}
	w.loseRecord("restarted")
	ageClaim(cx)
	kx := &Once{Key: "k:KX", Result: json.RawMessage(`{"content":[{"type":"text","text":"2"}]}`)}
	_, err := w.d.AfterUncheckedCall(ctx, w.key, cx, lX, kx, started)
	lX.Done(sessions.ErrMoved)
	w.d.Wait()
	if !LostHere(err) {
		t.Fatalf("X: want LostHere, got %v", err)
	}
	// The client retries X with the same key: at a ...
	ca, err := w.d.BeforeCall(ctx, w.key)
	if err != nil || ca == nil {
		t.Fatalf("a: claim: %v %v", ca, err)
	}
	if r := w.d.Replay(ca, "k:KX"); r != nil {
		t.Errorf("a answers the retry of X, which failed as not kept (LostHere), from its first run: %s", r)
	}
	// ... or at b.
	cb, err := w.bD.BeforeCall(ctx, w.key)
	if err != nil || cb == nil {
		t.Fatalf("b: claim: %v %v", cb, err)
	}
	if r := w.bD.Replay(cb, "k:KX"); r != nil {
		t.Errorf("b answers the retry of X, which failed as not kept (LostHere), from its first run: %s", r)
	}
}
