package durable

import "testing"

// TestStoreLostPluginFirstUsedElsewhereSaid: replica a is stopped in the
// middle of a call of alice's p, and replica b serves the session
// meanwhile, using q for the first time (q: 2, acknowledged, saved).
// Then the store loses the record, and a, continued, cannot tell that
// what it holds is the newest: it says lost every plugin it knows of (p)
// and claims the session. q's state went with the record, but a never
// knew of q: the fault suite's sigstop-redis-empty found q starting
// afresh at a with no stateReset (its acknowledged 2 reset silently).
// (b, which knew of q, would say so: goneFrom. a did not.)
//
// Now a records every other plugin lost too ("p/*/", sessions.AnyPlugin):
// the client's next call of q, at a, says stateReset store-lost, once:
// what a saves after it goes on at b.
func TestStoreLostPluginFirstUsedElsewhereSaid(t *testing.T) {
	for _, how := range []string{"evicted", "restarted"} {
		t.Run(how, func(t *testing.T) {
			w := newTwoReplicas(t)
			w.callSaved(w.claim(), w.p) // a: p 1, saved
			cx, lX, started := w.unchecked(w.p, "2")
			// a is stopped here; b serves the session, q first.
			if got := w.bCallsOf(w.q, 2); got != "2" {
				t.Fatalf("b: q counts %s, want 2", got)
			}
			w.loseRecord(how)
			w.continueStopped(cx, lX, started)
			// The client's next call of q goes to a.
			got, reset := w.callOf(w.q, false)
			switch {
			case got == "3":
			case reset == "":
				t.Fatalf("a: q counts %s with no reset; b acknowledged 2, and the store lost it", got)
			case reset != ReasonStoreLost:
				t.Errorf("a: q's reset reason %q, want %q", reset, ReasonStoreLost)
			}
			// And the next to b: q goes on from what a saved.
			next := w.bCallsOf(w.q, 1)
			if want := map[string]string{"1": "2", "3": "4"}[got]; next != want {
				t.Errorf("b: q counts %s after a's %s, want %s", next, got, want)
			}
		})
	}
}
