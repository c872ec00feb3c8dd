package durable

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// hookedStored replaces w's session layer and keeper (replica a, over
// store) with ones whose Options.Stored runs *hook (once) right after
// Keeper.Stored returned, before the lease goes on.
func hookedStored(t *testing.T, w *lossyWorld, store interface{}, opts sessions.Options, hook *atomic.Pointer[func(ctx context.Context)]) {
	opts.Stored = func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		st, why, under, known := w.d.Stored(ctx, key, p)
		if h := hook.Swap(nil); h != nil {
			(*h)(ctx)
		}
		return st, why, under, known
	}
	w.ses = sessions.New(&opts)
	t.Cleanup(func() { w.ses.Close(w.ctx) })
	switch s := store.(type) {
	case *claimLossy:
		w.d = New(Options{Store: s, Sessions: w.ses, Replica: "a"})
	case *lossyStore:
		w.d = New(Options{Store: s, Sessions: w.ses, Replica: "a"})
	default:
		t.Fatalf("store %T", store)
	}
}

// movePlugin leaves p's instance dropped as moved while the session's
// claim here is current (the route of TestMovedPluginStartsFromTheStore):
// p counts one more than before, unverified, and is dropped.
func movePlugin(t *testing.T, w *lossyWorld, c *Claim) *Claim {
	t.Helper()
	d, ctx := w.d, w.ctx
	l := w.acquire(w.p)
	w.count(l)
	ageClaim(c)
	d.downUntil.Store(int64(sinceBase() + time.Hour))
	if _, err := d.AfterCall(ctx, w.key, c, l, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("want errUnverified, got %v", err)
	}
	d.downUntil.Store(0)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil || c2 == c {
		t.Fatalf("take: %v %v", c2, err)
	}
	l.Done(sessions.ErrMoved)
	return c2
}

// Keeper.Stored reads p's state under the claim of fence F1; before the
// lease goes on (it may wait in reserve for room), replica b takes the
// session and saves two calls, and another request of the session at a
// claims it back and seeds the client under the new fence F3 with b's
// state. The lease then fails as moved (the state read is not of the
// fence the client is seeded under now), and the next starts from b's.
// Before, it started p's instance from the state Stored read (before b's
// writes) under F3, and its checkpoint under F3 wrote over b's
// acknowledged calls.
func TestStoredStateSupersededBySeed(t *testing.T) {
	w := newTwoReplicas(t)
	var hook atomic.Pointer[func(context.Context)]
	hookedStored(t, w.lossyWorld, w.cs, sessions.Options{}, &hook)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved
	movePlugin(t, w.lossyWorld, c)
	h := func(context.Context) {
		if got := w.bCalls(2); got != "3" { // b: 2, 3, saved
			t.Errorf("b counts %s, want 3", got)
		}
		if _, err := d.BeforeCall(ctx, w.key); err != nil { // another request of a's
			t.Errorf("a: reclaim: %v", err)
		}
	}
	hook.Store(&h)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := w.ses.Acquire(ctx, w.key, w.p)
	if errors.Is(err, sessions.ErrMoved) {
		// The state read is superseded: the lease fails (the host claims
		// again, -32053 at worst), and the next starts from b's.
		l = w.acquire(w.p)
	} else if err != nil {
		t.Fatal(err)
	}
	got := w.count(l)
	why, err := d.AfterCall(ctx, w.key, c2, l, nil)
	l.Done(nil)
	t.Logf("a counts %s under fence %d (claim's seeded %d); checkpoint %q %v", got, l.Fence(), c2.seeded, why, err)
	if got != "4" {
		t.Errorf("a's instance started from the state Stored read before b's writes, under the fence of the claim that read b's: counts %s, want 4 (b saved 3)", got)
	}
	if err == nil && got != "4" {
		t.Errorf("and its checkpoint landed over b's acknowledged writes")
	}
}

// A call that began under a claim later forgotten ends after the session
// was claimed anew and the claim resumed (as in
// TestForgottenClaimWritesNothingAfterResume): it fails as moved, and
// it fails as moved, and only it: AfterCall forgets the claim it was
// given, not the session's claim now. Before, it dropped the *new* claim,
// which the next take resumed and retired, so the calls in flight under it
// failed in turn, and so on: with calls of two plugins overlapping, every
// call failed, though the store answered every time.
func TestRetiredClaimDoesNotCascade(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c1 := w.claim()
	w.callSaved(c1, w.p)
	w.callSaved(c1, w.q)
	prevC, prevL := c1, w.acquire(w.q)
	w.count(prevL)
	d.forget(w.key, c1) // another call could be neither saved nor verified
	failed := 0
	for i := range 6 {
		cur := w.claim()
		next := w.p
		if prevL.Plugin() == w.p {
			next = w.q
		}
		l := w.acquire(next)
		w.count(l)
		why, err := d.AfterCall(ctx, w.key, prevC, prevL, nil)
		if err != nil {
			failed++
			prevL.Done(sessions.ErrMoved)
			t.Logf("call %d (%s) fails: %q %v", i, prevL.Plugin().Name(), why, err)
		} else {
			prevL.Done(nil)
		}
		prevC, prevL = cur, l
	}
	prevL.Done(nil)
	if failed > 1 {
		t.Errorf("%d of 6 calls failed as moved; only the first began under the forgotten claim", failed)
	}
}

// A call served from memory under claim c1 (the store away) ends after c1
// was forgotten (another call could be neither saved nor verified) and
// the session claimed anew (resumed, c1 retired). ServedFromMemory notes
// its at-most-once result and its unsaved state on the session's claim
// now, not on c1, the retired one, which no one reads: before, the
// client's retry with its key ran again, and an eviction restored the
// store's older state with no stateReset.
func TestServedFromMemoryOnRetiredClaim(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c1 := w.claim()
	w.callSaved(c1, w.p)
	w.callSaved(c1, w.q)
	w.st.down.Store(true)
	m, err := d.BeforeCall(ctx, w.key)
	if !errors.Is(err, ErrServedFromMemory) || m != c1 {
		t.Fatalf("served from memory: %v %v", m, err)
	}
	lp := w.acquire(w.p)
	if got := w.count(lp); got != "2" { // X, a keyed call, in flight
		t.Fatalf("p: %s", got)
	}
	// Y, a call on q that began before, ends unverified: c1 forgotten.
	ageClaim(c1)
	lq := w.acquire(w.q)
	w.count(lq)
	if _, err := d.AfterCall(ctx, w.key, c1, lq, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("want errUnverified, got %v", err)
	}
	lq.Done(sessions.ErrMoved)
	// The store is back; another request claims the session: resumed.
	w.st.down.Store(false)
	d.downUntil.Store(0)
	c2 := w.claim()
	c1.mu.Lock()
	retired := c1.retired
	c1.mu.Unlock()
	if c2 == c1 || !retired {
		t.Fatalf("not resumed: new %v, old retired %v", c2 != c1, retired)
	}
	// X ends, as host/call.go ends a call served from memory.
	first := &Once{Key: "K", Result: json.RawMessage(`{"content":[{"type":"text","text":"2"}]}`)}
	d.ServedFromMemory(w.key, m, w.p.Name(), first)
	if _, err := d.AfterCall(ctx, w.key, nil, lp, first); err != nil {
		t.Fatal(err)
	}
	lp.Done(nil)
	// The client retries X with its key.
	c3, err := d.BeforeCall(ctx, w.key)
	if err != nil {
		t.Fatal(err)
	}
	if d.Replay(c3, "K") == nil {
		t.Errorf("the retry of a call served from memory is not answered from its first run: it runs again")
	}
	if st, why, _ := d.Saved(ctx, w.key, w.p); why != ReasonNotSaved {
		t.Errorf("an eviction of p now restores the store's state (%v bytes), reason %q: the not-saved count 2 rolled back silently", st != nil, why)
	}
}

// getHooked runs a hook once right after a Get returned.
type getHooked struct {
	*lossyStore
	after atomic.Pointer[func()]
}

func (s *getHooked) Get(ctx context.Context, id string) (map[string][]byte, error) {
	rec, err := s.lossyStore.Get(ctx, id)
	if h := s.after.Swap(nil); h != nil {
		(*h)()
	}
	return rec, err
}

// A call in flight under a forgotten claim c1 ends between the new take's
// read of the record and its resume of c1. c1 is retired before the read
// now, so that call writes nothing (it fails as moved). Before, c1 was
// retired only in resume: the call was saved with its at-most-once
// result and told success, but the new claim's notes for q were the
// record's as read before that write, so its key was lost and the
// client's retry ran it again.
func TestForgottenClaimWritesNothingAfterTakeRead(t *testing.T) {
	w := newLossyWorld(t)
	gh := &getHooked{lossyStore: w.st}
	w.d = New(Options{Store: gh, Sessions: w.ses, Replica: "a"})
	d, ctx := w.d, w.ctx
	c1 := w.claim()
	w.callSaved(c1, w.p)
	w.callSaved(c1, w.q)
	lq := w.acquire(w.q)
	if got := w.count(lq); got != "2" {
		t.Fatalf("q: %s", got)
	}
	d.forget(w.key, c1) // another call could be neither saved nor verified
	first := &Once{Key: "K", Result: json.RawMessage(`{"content":[{"type":"text","text":"2"}]}`)}
	saved := false
	h := func() {
		why, err := d.AfterCall(ctx, w.key, c1, lq, first)
		lq.Done(nil)
		if err != nil || why != "" {
			t.Logf("the call under c1: %q %v (not told success: no violation)", why, err)
			return
		}
		saved = true
		t.Logf("the call under c1 is saved and told success")
	}
	gh.after.Store(&h)
	c2 := w.claim()
	if saved && d.Replay(c2, "K") == nil {
		t.Errorf("the call acknowledged under the forgotten claim lost its at-most-once key: a retry runs it again")
	}
}

// A lease of a plugin marked moved whose last state was not saved fails
// before its instance starts (the instance limit is reached): the next
// lease still says the state was reset (not-saved). Before, Keeper.Stored
// used the note up ("said once") before the lease could fail, and the next
// lease's Stored read the store's older state, with no stateReset.
func TestStoredNoteOutlivesFailedLease(t *testing.T) {
	w := newLossyWorld(t)
	var hook atomic.Pointer[func(context.Context)]
	hookedStored(t, w, w.st, sessions.Options{MaxInstances: 1}, &hook)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved
	l := w.acquire(w.p)
	w.count(l) // 2
	w.st.losePut.Store(true)
	if why, err := d.AfterCall(ctx, w.key, c, l, nil); err != nil || why != NotSavedUnavailable {
		t.Fatalf("lost put: %q %v", why, err)
	}
	l.Done(nil)
	d.downUntil.Store(0)
	movePlugin(t, w, c) // p: 3, unverified, dropped; the new claim holds p's not-saved note
	// Another plugin's call holds the only instance allowed.
	lq := w.acquire(w.q)
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ses.Acquire(ctx, w.key, w.p); !errors.Is(err, sessions.ErrAtCapacity) {
		t.Fatalf("want ErrAtCapacity, got %v", err)
	}
	lq.Done(nil)
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	l = w.acquire(w.p)
	got, n := w.count(l), l.Notice()
	l.Done(nil)
	if n.Reset == nil {
		t.Errorf("p restarts from the store's state with no stateReset: counts %s (the client was told 2, not saved)", got)
	}
}

// p's instance was dropped as moved (its state, 2, is in the store). The
// store loses the record between a call's verify and its checkpoint (of
// q): relost claims the session again and writes back "mcp" and q, but
// p, whose instance is gone, is seeded lost (reason store-lost), as
// recover does on verify's route. Before, nothing said p's state was
// gone: p's next lease asked Keeper.Stored, which found no p in the record
// and answered "none saved: a fresh start", and p started afresh with no
// stateReset.
func TestStoredLostAfterRelost(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // 1
	w.callSaved(c, w.p) // 2, saved
	w.callSaved(c, w.q)
	c2 := movePlugin(t, w, c) // p: 3 unverified; dropped as moved
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	l := w.acquire(w.q)
	w.count(l)
	w.st.Store.(interface{ Expire(string) }).Expire(StoreID(w.key))
	if why, err := d.AfterCall(ctx, w.key, c2, l, nil); err != nil || why != "" {
		t.Fatalf("q after the record was lost: %q %v", why, err)
	}
	l.Done(nil)
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	l = w.acquire(w.p)
	got, n := w.count(l), l.Notice()
	l.Done(nil)
	if n.Reset == nil {
		t.Errorf("p starts afresh (counts %s) with no stateReset; its saved state 2 was lost with the record", got)
	}
}
