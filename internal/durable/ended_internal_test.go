package durable

import (
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestEndedAfterForgetLeavesOthersRecord: a stateful session
// served by a moves to b while a call of a's runs; a's checkpoint is
// fenced (errMoved) and a forgets its claim (Keeper.forget), but its
// go-sdk session lives on at a, idle. b acknowledges 2 and 3, then
// drains (releases its claims: a rolling restart). a's idle timeout then
// ends its copy of the session: Keeper.Ended finds no claim (it was
// forgotten), claims the session without stealing, which succeeds (no
// live holder), and deleted the record b's acknowledged calls are in (a
// review): the client's next request, at a third replica, found nothing,
// and its plugin started afresh unsaid. Now a claim that finds the
// session held by another since (statestore.Claim.Held false) deletes
// nothing.
func TestEndedAfterForgetLeavesOthersRecord(t *testing.T) {
	w := newTwoReplicas(t)
	w.key = sessions.Conn(new(int), "sid-ended", "sid-ended")
	c := w.claim()
	w.callSaved(c, w.p) // a: 1, saved
	l := w.acquire(w.p)
	w.count(l) // a: 2, in flight
	if got := w.bCalls(2); got != "3" {
		t.Fatalf("b counts %s, want 3", got)
	}
	if _, err := w.d.AfterCall(w.ctx, w.key, c, l, nil); !errors.Is(err, errMoved) {
		t.Fatalf("a's checkpoint: %v, want errMoved", err)
	}
	l.Done(sessions.ErrMoved)
	if err := w.bD.Drain(w.ctx); err != nil {
		t.Fatal(err)
	}
	// a's go-sdk session times out, idle since the client left for b.
	w.d.Ended(w.key)
	rec, err := w.st.Store.Get(w.ctx, StoreID(w.key))
	t.Logf("record after a's Ended: %d fields, %v", len(rec), err)
	if errors.Is(err, statestore.ErrNotFound) || rec["p/"+w.p.Name()] == nil {
		t.Errorf("a's Ended deleted the record holding b's acknowledged calls (b drained; the client's session is in use)")
	}
	// The client's next request reaches a third replica.
	cSes := sessions.New(&sessions.Options{})
	t.Cleanup(func() { cSes.Close(w.ctx) })
	cD := New(Options{Store: w.st.Store, Sessions: cSes, Replica: "c"})
	cc, err := cD.BeforeCall(w.ctx, w.key)
	if err != nil || cc == nil {
		t.Fatalf("c: claim %v %v", cc, err)
	}
	lc, err := cSes.Acquire(w.ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	got, reset := w.count(lc), lc.Notice().Reset
	lc.Done(nil)
	t.Logf("c counts %s, reset %+v", got, reset)
	if got != "4" && reset == nil {
		t.Errorf("c counts %s with no stateReset after b acknowledged 3", got)
	}
}
