package durable

import (
	"context"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// The first claim of a session made here (TestMadeHereFirstClaim) that
// comes while one of its calls, served from memory, starts its instance
// keeps that instance too: the call's effect goes on under the claim,
// marked not saved until a checkpoint writes it. The claim is made here
// where the lease restarts an evicted instance (between the lease's
// reading of the fence and the instance's start, as sessions.Options.Saved
// is asked there). The instance recorded fence 0: the next call dropped
// it as of another owner and counted 1 again, with no reset said.
func TestMadeHereFirstClaimWhileInstanceStarts(t *testing.T) {
	var during func()
	w := newLossyWorldWith(t, func(w *lossyWorld, o *sessions.Options) {
		o.MaxInstances = 1
		o.Saved = func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
			st, why, known := w.d.Saved(ctx, key, p)
			if during != nil {
				during()
			}
			return st, why, known
		}
	})
	w.key = sessions.Conn("conn", "s-made-here", "made-here")
	ctx := w.ctx
	l := w.acquire(w.p) // served from memory: no claim
	w.count(l)
	l.Done(nil)
	other, err := w.ses.Acquire(ctx, sessions.Conn("conn", "s-other", "other"), w.q) // evicts p's
	if err != nil {
		t.Fatal(err)
	}
	other.Done(nil)
	var c *Claim
	during = func() { c = w.claim() }
	l = w.acquire(w.p) // served from memory, its instance starting as the claim comes
	during = nil
	if got := w.count(l); got != "1" {
		t.Fatalf("from memory after the eviction: count %s", got)
	}
	l.Done(nil)
	c.mu.Lock()
	why := c.unsaved[w.p.Name()]
	c.mu.Unlock()
	l = w.acquire(w.p)
	got, reset := w.count(l), l.Notice().Reset
	if _, err := w.d.AfterCall(ctx, w.key, c, l, nil); err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	if got != "2" || reset != nil || why != NotSavedUnavailable {
		t.Fatalf("the call after the claim: count %s, reset %+v, not saved at the claim %q; want 2, none, %q", got, reset, why, NotSavedUnavailable)
	}
}
