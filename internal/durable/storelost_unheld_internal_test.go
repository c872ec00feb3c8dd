package durable

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestStoreLostUnheldPluginSaidElsewhere: the store comes
// back empty (a Redis restarted without persistence) while replica a
// holds alice's q but no longer p (evicted for room; p's 3 was saved).
// a's next claim finds the loss and writes back what it holds (recover):
// "mcp" and q. p's state is gone, and a knows it: announceLost seeds p as
// lost at a only (its next lease there says stateReset store-lost). But
// nothing of that reaches the record: p is not marked not saved (only
// held plugins are), so neither the heartbeat's writeLost nor a drain
// records it. When the session then moves (a drains, or hangs), replica
// b finds a record with "mcp" and q and no p, and starts p afresh without
// a word: alice's 3 is reset silently, where the guarantee table says a
// state the store lost and no replica holds comes with stateReset
// store-lost. "drain" and "killed" are the two ways the session leaves a.
//
// It fails for both: b counts 1 with no reset.
func TestStoreLostUnheldPluginSaidElsewhere(t *testing.T) {
	for _, how := range []string{"drain", "killed"} {
		t.Run(how, func(t *testing.T) {
			w := newEvictingWorld(t)
			d, ctx := w.d, w.ctx
			c := w.claim()
			for range 3 {
				w.callSaved(c, w.p) // p: 3, acknowledged, saved
			}
			w.callSaved(c, w.q) // q: 1; evicts alice's p (room for one)
			if w.ses.Holds(w.key, w.p.Name()) {
				t.Fatal("alice's p not evicted")
			}
			mem := w.st.Store.(*statestore.Memory)
			mem.Flush() // the store comes back empty, a new epoch
			// a's next request finds the loss and writes back q.
			c = w.claim()
			w.callSaved(c, w.q) // q: 2
			d.Wait()
			d.renewAll([]*claimOf{{w.key, c}}) // heartbeats: resave, writeLost
			d.Wait()
			if how == "drain" {
				if err := d.Drain(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// b takes the session over.
			ses := sessions.New(nil)
			t.Cleanup(func() { ses.Close(ctx) })
			b := New(Options{Store: mem, Sessions: ses, Replica: "b"})
			if _, err := b.BeforeCall(ctx, w.key); err != nil {
				t.Fatal(err)
			}
			lq, err := ses.Acquire(ctx, w.key, w.q)
			if err != nil {
				t.Fatal(err)
			}
			gotQ := w.count(lq)
			lq.Done(nil)
			if gotQ != "3" {
				t.Fatalf("b: q counts %s, want 3 (a wrote q's 2 back)", gotQ)
			}
			lp, err := ses.Acquire(ctx, w.key, w.p)
			if err != nil {
				t.Fatal(err)
			}
			defer lp.Done(nil)
			got, reset := w.count(lp), lp.Notice().Reset
			if reset == nil {
				t.Fatalf("b: p counts %s with no reset; p's 3 was acknowledged, the store lost it, and a knew (store-lost): want stateReset store-lost", got)
			}
			if reset.Reason != ReasonStoreLost {
				t.Errorf("b: p's reset reason %q, want %q", reset.Reason, ReasonStoreLost)
			}
		})
	}
}
