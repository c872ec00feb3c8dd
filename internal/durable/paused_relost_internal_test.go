package durable

import (
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestPausedReplicaDoesNotWriteBackOverLostRecord: replica a is
// stopped (SIGSTOP, a frozen VM) in the middle of a contained call X of
// alice's p (its guest ran: 2; its checkpoint not sent). Meanwhile the
// proxy moves the session to b, which takes it over from the store (1)
// and acknowledges two calls (2, 3, saved). Then the store loses the
// record: evicted ("evicted"), or Redis restarted empty ("restarted").
// a is continued, and X's write meets the loss: relost claims the
// session (no previous holder: the record is gone) and, finding no
// plugin's state in the record, writes back what a holds: X's 2, from an
// instance that was stale for the whole of b's service. X is answered as
// saved. b's next call verifies its claim, finds a the holder, reads the
// record a wrote and seeds from it: b counts 3 again, with no stateReset:
// b's acknowledged 3 is rolled back silently, and the guarantee for a
// stopped replica ("a result computed later checks the fence before it
// is sent"; "never serves a session another replica took over") does not
// hold once the store forgot the fence.
//
// Want: a's X not answered as saved over a session it may have lost
// (its claim verified long before: ErrOutcomeUnknown or a run again,
// claimed first), and b's next call 4, or a reset said. It fails.
func TestPausedReplicaDoesNotWriteBackOverLostRecord(t *testing.T) {
	for _, how := range []string{"evicted", "restarted"} {
		t.Run(how, func(t *testing.T) {
			w := newTwoReplicas(t)
			d, ctx := w.d, w.ctx
			c := w.claim()
			w.callSaved(c, w.p) // a: p 1, saved
			cx, lX, started := w.unchecked(w.p, "2")
			// a is stopped here; b serves the session.
			if got := w.bCalls(2); got != "3" {
				t.Fatalf("b counts %s, want 3", got)
			}
			mem := w.st.Store.(*statestore.Memory)
			if how == "evicted" {
				mem.Expire(StoreID(w.key))
			} else {
				mem.Flush()
			}
			// a is continued, long after its claim was verified.
			ageClaim(cx)
			why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, nil, started)
			if errors.Is(err, ErrRunAgain) {
				lX.Done(sessions.ErrMoved) // as the host drops it
			} else {
				lX.Done(nil)
			}
			d.Wait()
			aSaved := err == nil && why == ""
			// b's next call.
			bc, berr := w.bD.BeforeCall(ctx, w.key)
			if berr != nil || bc == nil {
				t.Fatalf("b: claim: %v %v", bc, berr)
			}
			bl, lerr := w.bSes.Acquire(ctx, w.key, w.p)
			if lerr != nil {
				t.Fatal(lerr)
			}
			got, reset := w.count(bl), bl.Notice().Reset
			bl.Done(nil)
			if got != "4" && reset == nil {
				t.Errorf("b's next call counts %s with no reset; b acknowledged 3 (a's X: %q %v, answered saved %v): rolled back to the stopped replica's stale state", got, why, err, aSaved)
			}
			if aSaved {
				t.Errorf("a's call X, computed on an instance b's service made stale, answered as saved")
			}
		})
	}
}
