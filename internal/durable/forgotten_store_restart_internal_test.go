package durable

import (
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestForgottenClaimAfterStoreRestartKeepsState: Redis
// goes away, and a call of alice's p (3) can be neither saved nor
// verified (the breaker open, its claim verified over 2 s before):
// errUnverified, the call fails and its instance goes, and the claim is
// forgotten (Keeper.forget). alice's q (1, acknowledged and saved) is
// still held. Redis comes back empty (a new epoch). alice's next request
// takes the session again (take): the forgotten claim is not resumable
// (the new claim's Taken is not the old one's: the store forgot it), so
// the session is seeded from the empty record under the new fence, which
// retires q's instance without a notice; q starts afresh, silently, and
// p's acknowledged 2, lost with the store, is not said lost either.
// verify's rule for the same store loss (no previous holder, no plugin
// state in the record: write back what this replica holds, and say
// store-lost for what it does not) is not applied by take.
//
// Want: q goes on (2), or says stateReset; p says stateReset (store-lost).
// It fails: q counts 1 with no reset.
func TestForgottenClaimAfterStoreRestartKeepsState(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	w.callSaved(c, w.p) // p: 2, acknowledged, saved
	w.callSaved(c, w.q) // q: 1, acknowledged, saved
	// Redis goes away; p's next call is neither saved nor verified.
	w.st.down.Store(true)
	ageClaim(c)
	d.downUntil.Store(int64(sinceBase() + breakerWindow))
	l := w.acquire(w.p)
	w.count(l) // p: 3
	if _, err := d.AfterCall(ctx, w.key, c, l, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("p's call: %v, want errUnverified", err)
	}
	l.Done(sessions.ErrMoved) // the call failed; its instance goes
	// Redis comes back empty.
	w.st.Store.(*statestore.Memory).Flush()
	w.st.down.Store(false)
	d.downUntil.Store(0)
	if !w.ses.Holds(w.key, w.q.Name()) {
		t.Fatal("q's instance is not held before the next request")
	}
	gotQ, resetQ := w.claimedCall(w.q)
	gotP, resetP := w.claimedCall(w.p)
	if gotQ != "2" && resetQ == nil {
		t.Errorf("q counts %s with no reset; its acknowledged 1 was held by this replica when the store came back empty, and dropped without a word", gotQ)
	}
	if resetP == nil {
		t.Errorf("p counts %s with no reset; its acknowledged 2 was lost with the store: want stateReset store-lost", gotP)
	}
}
