package durable

import (
	"errors"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestPausedReplicaDoesNotWriteBackOverLostRecord: replica a is
// stopped (SIGSTOP, a frozen VM) in the middle of a contained call X of
// alice's p (its guest ran: 2; its checkpoint not sent). Meanwhile the
// proxy moves the session to b, which takes it over from the store (1)
// and acknowledges two calls (2, 3, saved). Then the store loses the
// record: evicted ("evicted"), or Redis restarted empty ("restarted").
// a is continued, and X's write meets the loss. A review (stop 59) found
// relost claiming the session (no previous holder: the record is gone)
// and writing back what a held, X's 2, from an instance stale for the
// whole of b's service, and X answered as saved; b's next call found a
// the holder and counted 3 again, with no stateReset: b's acknowledged 3
// rolled back silently.
//
// Now a cannot tell that what it holds is the newest (its claim was
// verified long before, and the fence counter moved past its own or the
// epoch changed; no heartbeat ran here): it writes nothing back, says
// its plugins' states lost, and X is not kept (run again, or told to call
// again). b's next call says its state was reset (store-lost), or goes
// on from 3: never 3 rolled back unsaid.
func TestPausedReplicaDoesNotWriteBackOverLostRecord(t *testing.T) {
	for _, how := range []string{"evicted", "restarted"} {
		t.Run(how, func(t *testing.T) {
			w := newTwoReplicas(t)
			ctx := w.ctx
			c := w.claim()
			w.callSaved(c, w.p) // a: p 1, saved
			cx, lX, started := w.unchecked(w.p, "2")
			// a is stopped here; b serves the session.
			if got := w.bCalls(2); got != "3" {
				t.Fatalf("b counts %s, want 3", got)
			}
			w.loseRecord(how)
			// a is continued, long after its claim was verified.
			why, err := w.continueStopped(cx, lX, started)
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
			if err != nil && !errors.Is(err, ErrRunAgain) && !LostHere(err) {
				t.Errorf("a's call X failed with %v; want it said lost (LostHere), so that its result tells the client", err)
			}
		})
	}
}

// continueStopped ends the unchecked call cx of a replica continued
// after a stop, long after its claim was verified, as the host does
// (a call to run again is dropped as moved), and waits for what it writes
// in the background.
func (w *twoReplicas) continueStopped(cx *Claim, lX *sessions.Lease, started time.Time) (NotSaved, error) {
	ageClaim(cx)
	why, err := w.d.AfterUncheckedCall(w.ctx, w.key, cx, lX, nil, started)
	if errors.Is(err, ErrRunAgain) {
		lX.Done(sessions.ErrMoved)
	} else {
		lX.Done(nil)
	}
	w.d.Wait()
	return why, err
}

// callOf runs one call of p at replica a (claimed first), saved, keeping
// its notice for the next call if keep (sessions.Lease.KeepNotice), and
// returns its count and the reason of the reset it says ("" for none).
func (w *twoReplicas) callOf(p *plugins.Plugin, keep bool) (count, reset string) {
	w.t.Helper()
	c := w.claim()
	l := w.acquire(p)
	if r := l.Notice().Reset; r != nil {
		reset = r.Reason
	}
	if keep {
		l.KeepNotice()
	}
	count = w.count(l)
	if why, err := w.d.AfterCall(w.ctx, w.key, c, l, nil); err != nil || why != "" {
		w.t.Fatalf("a: checkpoint: %q %v", why, err)
	}
	l.Done(nil)
	w.d.Wait()
	return count, reset
}

// loseRecord makes the store lose the world's session record: "evicted"
// alone (the fence counter kept), or "restarted" empty (a new epoch).
func (w *twoReplicas) loseRecord(how string) {
	mem := w.st.Store.(*statestore.Memory)
	if how == "evicted" {
		mem.Expire(StoreID(w.key))
	} else {
		mem.Flush()
	}
}
