package durable

import (
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestReplayAfterWriteLostTakeover (review, open question 1): a
// call with an idempotency key whose checkpoint got no answer (count 4,
// answered notSaved), whose instance was then evicted, and whose loss
// the heartbeat recorded in the record (writeLost: reason not-saved, the
// key's first result kept beside it), is retried by its client at
// replica b, which took the session over. The retry is answered with
// the first result (not run again on the reset state), its lease says
// the state was reset (not-saved), and the next call goes on from the
// fresh instance (1), saying nothing more. The record b writes then
// still keeps the key. This pins the behaviour (it passes).
func TestReplayAfterWriteLostTakeover(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	first := &Once{Key: "k:review", Result: json.RawMessage(`{"content":[{"type":"text","text":"4"}]}`)}
	// 4 is answered, its write gets no answer, and p is evicted.
	unsavedWith(t, w, c, func() { w.st.losePut.Store(true) }, first)
	d.renewAll([]*claimOf{{w.key, c}}) // the heartbeat: writeLost
	if pr, err := readPlugin(w.record(t), w.p.Name()); err != nil || pr.Reason != ReasonNotSaved {
		t.Fatalf("the record after writeLost: %+v %v; want p lost, not-saved", pr, err)
	}

	// Replica b takes the session over; the client retries its call.
	ses := sessions.New(nil)
	t.Cleanup(func() { ses.Close(ctx) })
	b := New(Options{Store: w.st.Store, Sessions: ses, Replica: "b"})
	cb, err := b.BeforeCall(ctx, w.key)
	if err != nil || cb == nil {
		t.Fatalf("b: claim: %v %v", cb, err)
	}
	// As the host's callTool: lease the instance, then the replay.
	lr, err := ses.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	replay := b.Replay(cb, first.Key)
	reset := lr.Notice().Reset
	lr.Done(nil)
	if string(replay) != string(first.Result) {
		t.Fatalf("b's answer to the retry: %s; want the first result %s (else it runs again)", replay, first.Result)
	}
	if reset == nil || reset.Reason != ReasonNotSaved {
		t.Fatalf("the replayed retry's lease says reset %+v; want not-saved: the state it answered on was lost", reset)
	}
	// The client's next call goes on from the fresh instance, told once.
	cb, err = b.BeforeCall(ctx, w.key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ses.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	got, again := w.count(ln), ln.Notice().Reset
	if _, err := b.AfterCall(ctx, w.key, cb, ln, nil); err != nil {
		t.Fatal(err)
	}
	ln.Done(nil)
	if got != "1" || again != nil {
		t.Fatalf("b's next call counts %s (reset %+v); want 1, no second reset", got, again)
	}
	if replay := b.Replay(cb, first.Key); string(replay) != string(first.Result) {
		t.Fatalf("after b's write the key answers %s; want the first result", replay)
	}
	pr, err := readPlugin(w.record(t), w.p.Name())
	if err != nil || len(pr.Done) == 0 || pr.Done[len(pr.Done)-1].Key != first.Key {
		t.Fatalf("b's record of p: done %+v, %v; want the key kept", pr.Done, err)
	}
}

// record reads the world's session record from the store (unbounded).
func (w *lossyWorld) record(t *testing.T) map[string][]byte {
	t.Helper()
	rec, err := w.st.Store.Get(w.ctx, StoreID(w.key))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
