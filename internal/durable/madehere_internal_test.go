package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// A stateful session made here and served from memory before any claim
// (its instance under no fence) keeps that instance at its first claim
// when the claim finds no previous holder and no plugin's state: no
// other replica can have served it. When another replica did claim it
// first (it took the session over from a record of it), the instance is
// stale, and what its calls did from memory is said lost (stateReset
// not-saved), never dropped without a word.
func TestMadeHereFirstClaim(t *testing.T) {
	for _, elsewhere := range []bool{false, true} {
		w := newLossyWorld(t)
		w.key = sessions.Conn("conn", "s-made-here", "made-here")
		l := w.acquire(w.p) // served from memory: no claim
		if got := w.count(l); got != "1" {
			t.Fatalf("from memory: count %s", got)
		}
		l.Done(nil)
		if elsewhere {
			if _, err := w.st.Store.Claim(w.ctx, StoreID(w.key), statestore.Owner{Replica: "b", Boot: "b1"}, w.d.ttl(), true); err != nil {
				t.Fatal(err)
			}
		}
		c := w.claim()
		l = w.acquire(w.p)
		got, reset := w.count(l), l.Notice().Reset
		if _, err := w.d.AfterCall(w.ctx, w.key, c, l, nil); err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
		switch {
		case !elsewhere && (got != "2" || reset != nil):
			t.Errorf("first claim, no one else: count %s, reset %+v; want 2, none", got, reset)
		case elsewhere && (got != "1" || reset == nil || reset.Reason != ReasonNotSaved):
			t.Errorf("first claim after another replica's: count %s, reset %+v; want 1, not-saved", got, reset)
		}
	}
}
