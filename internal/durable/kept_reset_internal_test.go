package durable

import "testing"

// TestKeptResetRecordedWithState: after replica a says alice's p lost (a
// store back empty while a was stopped: lostWithStore), the first call on
// p's fresh instance at a is a request that sat in a through the stop:
// its client may be gone, so it keeps the reset notice for the next call
// (sessions.Lease.KeepNotice). Its checkpoint writes the fresh state over
// the record's mark of the loss. The fault suite's sigstop-redis-empty
// found the client's next call then served by replica b, which started
// from that state with no word: the client's acknowledged notes reset
// silently. Now the state is recorded with the reset unsaid
// (pluginRecord.Unsaid): b says it, once.
func TestKeptResetRecordedWithState(t *testing.T) {
	w := newTwoReplicas(t)
	w.callSaved(w.claim(), w.p) // a: p 1, saved
	cx, lX, started := w.unchecked(w.p, "2")
	if got := w.bCalls(1); got != "2" { // b serves the session meanwhile
		t.Fatalf("b counts %s, want 2", got)
	}
	w.loseRecord("restarted")
	w.continueStopped(cx, lX, started)
	// A request that sat in a through the stop takes p's fresh instance,
	// and keeps its notice.
	if _, reset := w.callOf(w.p, true); reset == "" {
		t.Fatal("a: p's fresh instance has no reset notice")
	}
	// The client's next call goes to b, and the one after too.
	for i, want := range []string{ReasonStoreLost, ""} {
		bc, err := w.bD.BeforeCall(w.ctx, w.key)
		if err != nil || bc == nil {
			t.Fatalf("b: claim: %v %v", bc, err)
		}
		bl, err := w.bSes.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatal(err)
		}
		got, reset := w.count(bl), ""
		if r := bl.Notice().Reset; r != nil {
			reset = r.Reason
		}
		if why, err := w.bD.AfterCall(w.ctx, w.key, bc, bl, nil); err != nil || why != "" {
			t.Fatalf("b: checkpoint: %q %v", why, err)
		}
		bl.Done(nil)
		if reset != want {
			t.Errorf("b's call %d: p counts %s, reset %q; want reset %q (a's reset went to a request no one may have waited for)", i+1, got, reset, want)
		}
	}
}
