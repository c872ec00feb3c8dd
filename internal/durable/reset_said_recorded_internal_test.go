package durable

import (
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestResetSaidWithReplayIsRecorded: a call with an idempotency
// key (count 4) whose checkpoint got no answer is answered notSaved; its
// instance is evicted. The client's retry (its reply was lost) reaches
// replica a again: a's lease says stateReset not-saved (Keeper.Saved)
// and the first result is replayed, as the host's answerReplayed does.
// Saved drops the not-saved note ("said once"), and a replay writes
// nothing, so neither the heartbeat's resave nor writeLost ever records
// the loss: the record keeps the older state (3), without the key, for
// as long as the fresh instance sits idle, heartbeats or not. When the
// session then moves (a hangs, the proxy flaps), replica b restores 3
// without a word: the client, told its state was reset, finds the older
// state back (the fault checker's `phantom`: notes it saw gone), and the
// key is unknown there, so a retry of it would run again.
//
// It failed: b counted 4 with no reset, and b did not know the key.
func TestResetSaidWithReplayIsRecorded(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	first := &Once{Key: "k:review", Result: json.RawMessage(`{"content":[{"type":"text","text":"4"}]}`)}
	// 4 is answered, its write gets no answer, and p is evicted.
	unsavedWith(t, w, c, func() { w.st.losePut.Store(true) }, first)

	// The client's retry at a: claimed, leased (reset not-saved), replayed.
	c, err := d.BeforeCall(ctx, w.key)
	if err != nil || c == nil {
		t.Fatalf("a: claim: %v %v", c, err)
	}
	lr := w.acquire(w.p)
	reset := lr.Notice().Reset
	replay := d.Replay(c, first.Key)
	lr.Done(nil)
	if reset == nil || reset.Reason != ReasonNotSaved || string(replay) != string(first.Result) {
		t.Fatalf("a's replay: %s, reset %+v; want the first result, reset not-saved", replay, reset)
	}
	// Heartbeats go by: whatever they save again is saved.
	for range 3 {
		d.renewAll([]*claimOf{{w.key, c}})
		d.Wait()
	}

	// The session moves to b (a hangs; no drain).
	ses := sessions.New(nil)
	t.Cleanup(func() { ses.Close(ctx) })
	b := New(Options{Store: w.st.Store, Sessions: ses, Replica: "b"})
	cb, err := b.BeforeCall(ctx, w.key)
	if err != nil || cb == nil {
		t.Fatalf("b: claim: %v %v", cb, err)
	}
	known := b.Replay(cb, first.Key)
	ln, err := ses.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	got, again := w.count(ln), ln.Notice().Reset
	ln.Done(nil)
	if got != "1" && again == nil {
		t.Errorf("b's next call counts %s with no reset; the client was told at a that its state was reset (fresh: this call is 1), and the older state (3) came back unsaid", got)
	}
	if known == nil {
		t.Errorf("b does not know the key a replayed: a retry of it runs again at b")
	}
}
