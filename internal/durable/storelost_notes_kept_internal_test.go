package durable

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// putHooked runs a hook once, before the next put of the session's MCP
// record, as if another replica acted between this replica's claim and
// that write.
type putHooked struct {
	statestore.Store
	before atomic.Pointer[func()]
}

func (s *putHooked) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if field != "mcp" {
		return s.Store.Put(ctx, id, field, v, fence, ttl)
	}
	if f := s.before.Swap(nil); f != nil {
		(*f)()
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

// TestStoreLostNotesKeptPastAnotherClaim: replica a is stopped in the
// middle of a call of alice's p while b serves the session (3,
// acknowledged). The store loses the record, and a, continued, says p's
// state lost (it cannot tell that what it holds is the newest): its
// claim's notes say so, and its next instance of p would. But b claims
// the session between a's claim and a's first write, so nothing of the
// loss reaches the record, and b's claim is the newest when a claims
// again. The fault suite's sigstop-redis-empty found a's next claim
// dropping its notes (the record holds no state of p, and a had nothing
// of p saved): p started afresh at a, counting 1, with no stateReset; b's
// acknowledged 3 gone unsaid.
//
// Now a note of a state lost with the store outlives the claim that
// made it while the record holds nothing of that plugin: a's next call
// of p says store-lost (or goes on from b's 3, were it written back).
func TestStoreLostNotesKeptPastAnotherClaim(t *testing.T) {
	for _, how := range []string{"evicted", "restarted"} {
		t.Run(how, func(t *testing.T) {
			w := newTwoReplicas(t)
			h := &putHooked{Store: w.cs}
			w.d = New(Options{Store: h, Sessions: w.ses, Replica: "a"})
			w.callSaved(w.claim(), w.p) // a: p 1, saved
			cx, lX, started := w.unchecked(w.p, "2")
			// a is stopped here; b serves the session.
			if got := w.bCalls(2); got != "3" {
				t.Fatalf("b counts %s, want 3", got)
			}
			w.loseRecord(how)
			bClaims := func() {
				if c, err := w.bD.BeforeCall(w.ctx, w.key); err != nil || c == nil {
					t.Errorf("b: claim: %v %v", c, err)
				}
			}
			h.before.Store(&bClaims)
			why, err := w.continueStopped(cx, lX, started)
			if h.before.Load() != nil {
				t.Fatalf("a wrote nothing when continued (%q %v): the test did not put b's claim where it belongs", why, err)
			}
			got, reset := w.callOf(w.p, false)
			if got != "4" && reset == "" {
				t.Errorf("a's next call of p counts %s with no reset (a's X: %q %v); b acknowledged 3, and the store lost it", got, why, err)
			}
			if reset != "" && reset != ReasonStoreLost {
				t.Errorf("a: p's reset reason %q, want %q", reset, ReasonStoreLost)
			}
		})
	}
}
