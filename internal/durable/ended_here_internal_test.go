package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestClientEndedHereComesBackSeeded: the session layer ends alice's
// client (its idle timeout, or evicted past MaxClients: sessions.Manager
// tells the keeper nothing), and her next request comes before the
// heartbeat's sweep forgets the claim. The claim, verified under the same
// fence, seeded nothing, so her new client's instance started afresh
// under fence 0, whose checkpoint is refused as stale; the instance was
// then dropped as moved, and every later lease failed with ErrMoved (the
// store's state is read under the claim's fence, not the new client's):
// the sweep keeps the claim of a live client, so the session stayed
// refused (-32053) until the new client ended too. Now a claim whose
// client is not seeded under it any more seeds it again from the record.
func TestClientEndedHereComesBackSeeded(t *testing.T) {
	w := newLossyWorld(t)
	c := w.claim()
	w.callSaved(c, w.p)
	w.callSaved(c, w.p) // p: 2, saved
	w.ses.End(w.ctx, w.key)
	if got := w.d.CheckLater(w.key); got != nil {
		t.Errorf("CheckLater after the client ended here: a claim, want none (its next call is claimed first)")
	}
	for attempt := 1; ; attempt++ {
		c = w.claim()
		l, err := w.ses.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatalf("attempt %d: acquire: %v", attempt, err)
		}
		got, reset := w.count(l), l.Notice().Reset
		why, err := w.d.AfterCall(w.ctx, w.key, c, l, nil)
		if err != nil {
			l.Done(sessions.ErrMoved) // as the host does
			t.Errorf("attempt %d: count %s, checkpoint %q: %v", attempt, got, why, err)
			if attempt < 3 {
				continue
			}
			return
		}
		l.Done(nil)
		if got != "3" || reset != nil {
			t.Errorf("attempt %d: count %s, reset %+v; want 3, no reset (the state saved before the client ended here)", attempt, got, reset)
		}
		return
	}
}
