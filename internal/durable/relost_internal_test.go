package durable

import (
	"testing"
)

// A record the store lost, found by a write, is written back whole: every
// instance this replica holds, not only the plugin being saved (relost
// does what recover does). Here the store loses the record while replica
// a holds p (2, acknowledged and saved) and q; a's checkpoint of q finds
// the loss. a then dies without a drain, and b takes the session over: p
// goes on from 2, or says its state was reset. Before stop 57, relost
// wrote back "mcp" and q only, and p started afresh at b, silently (a
// review's finding).
func TestRelostWritesBackEveryHeldPlugin(t *testing.T) {
	w := newTwoReplicas(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	w.callSaved(c, w.p) // p: 2, acknowledged, saved
	w.callSaved(c, w.q) // q: 1
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	l := w.acquire(w.q)
	w.count(l) // q: 2
	w.st.Store.(interface{ Expire(string) }).Expire(StoreID(w.key))
	if why, err := d.AfterCall(ctx, w.key, c, l, nil); err != nil || why != "" {
		t.Fatalf("q after the record was lost: %q %v", why, err)
	}
	l.Done(nil)
	d.Wait() // whatever a writes back in the background is done
	// a is killed here; b takes the session over.
	bc, err := w.bD.BeforeCall(ctx, w.key)
	if err != nil || bc == nil {
		t.Fatalf("b: claim: %v %v", bc, err)
	}
	bl, err := w.bSes.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	got, n := w.count(bl), bl.Notice()
	bl.Done(nil)
	if got != "3" {
		t.Fatalf("b: p counts %s (reset %+v), want 3: a acknowledged 2 and held p's instance when it wrote the lost record back", got, n.Reset)
	}
}

// A held plugin whose write-back fails after relost stays marked not
// saved (its instance's next eviction says so, never the store's older
// state nor none), and the heartbeat's resave writes it once the store
// answers: a replica taking the session over then goes on from it.
func TestRelostFailedWriteBackSavedAgain(t *testing.T) {
	w := newTwoReplicas(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	w.callSaved(c, w.p) // p: 2, acknowledged, saved
	w.callSaved(c, w.q) // q: 1
	l := w.acquire(w.q)
	w.count(l) // q: 2
	w.st.Store.(interface{ Expire(string) }).Expire(StoreID(w.key))
	// The puts: q's (lost), the MCP record's, q's again, then p's
	// write-back, which gets no answer.
	w.st.loseNth.Store(4)
	if why, err := d.AfterCall(ctx, w.key, c, l, nil); err != nil || why != "" {
		t.Fatalf("q after the record was lost: %q %v", why, err)
	}
	l.Done(nil)
	d.Wait()
	if rec, err := w.st.Store.Get(ctx, StoreID(w.key)); err != nil || rec["p/"+w.p.Name()] != nil || rec["p/"+w.q.Name()] == nil {
		t.Fatalf("the record after the write-back (want q's state, not p's): %d fields, %v", len(rec), err)
	}
	c.mu.Lock()
	why := c.unsaved[w.p.Name()]
	c.mu.Unlock()
	if why == "" {
		t.Fatal("p's write-back failed, and p is not marked not saved")
	}
	d.downUntil.Store(0) // the store answers again
	d.resave(w.key, c)   // the heartbeat's
	if got := w.bCalls(1); got != "3" {
		t.Fatalf("b: p counts %s after a's resave, want 3", got)
	}
}
