package durable

import (
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestLiveReplicaMovedAwayDoesNotWriteBackOverLostRecord: replica a runs
// all along, its heartbeat loop going and the store answering it, but the
// session moves to b for a while (a proxy's fallback while a's health
// check failed, a client reconnecting elsewhere): b takes it over and
// acknowledges 2 and 3. Then the store loses the record (Redis back
// empty, or the record evicted alone while the fence counter was kept,
// b's claim having moved it past a's fence + 1). The client comes back to
// a. A review (stop 59) found a writing back its 1 and serving 2 with no
// stateReset, because its process had run all along since its claim was
// verified (beats.ranSince, the first version of the rule): but a claim
// goes unverified whenever nobody asks this replica for its session, not
// only when the store does not answer. Now the store answered a's
// heartbeat meanwhile, so no outage explains the unverified claim: a says
// its state lost (or goes on from b's 3), never b's calls rolled back
// silently.
func TestLiveReplicaMovedAwayDoesNotWriteBackOverLostRecord(t *testing.T) {
	movedAwayAndBack(t, nil, func(w *twoReplicas, c *Claim) {
		// a's claim was verified a while ago (the client was at b);
		// a's heartbeat loop ran every 2 s all along meanwhile.
		ageClaim(c)
		c.mu.Lock()
		v := c.verified.Sub(clockBase)
		c.mu.Unlock()
		for at := v - time.Second; at <= sinceBase(); at += heartbeatEvery {
			w.d.beats.beat(at)
			w.d.beats.answered(at, true)
		}
		w.d.beats.beat(sinceBase())
	})
}

// TestRecentlyVerifiedDoesNotWriteBackOverOthersCalls: as above, but the
// client comes back to a within 2 s of a's last verification.
// newestHere's first rule (verified within memoryGrace) says a's state is
// the newest, and a wrote back its 1 over b's acknowledged 3 with no
// stateReset (a review, stop 62): b's claim within a's grace was taken at
// once. Now the store's lease (statestore.Lease) makes b wait it out, so
// a's grace has run out when the client comes back.
func TestRecentlyVerifiedDoesNotWriteBackOverOthersCalls(t *testing.T) {
	movedAwayAndBack(t, func(w *twoReplicas) { statestore.SetLease(w.st.Store, statestore.Lease) }, nil)
}

// movedAwayAndBack: a saves 1; the session moves to b, which
// acknowledges 2 and 3; the store loses the record (evicted alone, or
// Redis back empty); after before (nil: nothing), the client's next call
// goes to a, which must not roll b's calls back unsaid. setup, if not
// nil, runs on the new world first.
func movedAwayAndBack(t *testing.T, setup func(*twoReplicas), before func(*twoReplicas, *Claim)) {
	for _, how := range []string{"evicted", "restarted"} {
		t.Run(how, func(t *testing.T) {
			w := newTwoReplicas(t)
			if setup != nil {
				setup(w)
			}
			c := w.claim()
			w.callSaved(c, w.p) // a: 1, saved
			if got := w.bCalls(2); got != "3" {
				t.Fatalf("b counts %s, want 3", got)
			}
			w.loseRecord(how)
			if before != nil {
				before(w, c)
			}
			// The client's next call, at a.
			ac, err := w.d.BeforeCall(w.ctx, w.key)
			if err != nil || ac == nil {
				t.Logf("a: claim: %v %v (refused: nothing rolled back)", ac, err)
				return
			}
			l := w.acquire(w.p)
			got, reset := w.count(l), l.Notice().Reset
			l.Done(nil)
			t.Logf("a counts %s, reset %+v", got, reset)
			if reset == nil && got != "4" {
				t.Errorf("a's call counts %s with no stateReset after b acknowledged 3: b's acknowledged calls rolled back silently", got)
			}
		})
	}
}
