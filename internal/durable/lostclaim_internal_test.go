package durable

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// claimLossy is a lossyStore whose next claim is applied by the store and
// its reply lost: either reported as unanswered (a deadline fired), or
// sent again once (go-redis's MaxRetries = 1 after a network error), the
// resend then answering for both.
type claimLossy struct {
	*lossyStore
	loseClaim   atomic.Bool
	resendClaim atomic.Bool
}

func (s *claimLossy) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	cl, err := s.lossyStore.Claim(ctx, id, o, ttl, steal)
	if err == nil && s.loseClaim.CompareAndSwap(true, false) {
		if s.resendClaim.Load() {
			return s.lossyStore.Claim(ctx, id, o, ttl, steal)
		}
		return statestore.Claim{}, errNoAnswer
	}
	return cl, err
}

// twoReplicas is a lossyWorld whose keeper (replica a) runs over a
// claimLossy store, and a second replica b (its own keeper and session
// layer) on the same store.
type twoReplicas struct {
	*lossyWorld
	cs   *claimLossy
	bSes *sessions.Manager
	bD   *Keeper
}

func newTwoReplicas(t *testing.T) *twoReplicas {
	w := newLossyWorld(t)
	cs := &claimLossy{lossyStore: w.st}
	w.d = New(Options{Store: cs, Sessions: w.ses, Replica: "a"})
	bSes := sessions.New(&sessions.Options{})
	t.Cleanup(func() { bSes.Close(w.ctx) })
	bD := New(Options{Store: w.st.Store, Sessions: bSes, Replica: "b"})
	return &twoReplicas{lossyWorld: w, cs: cs, bSes: bSes, bD: bD}
}

// bCalls runs n saved calls of p at replica b (which takes the session
// over from the store first) and returns b's last count.
func (w *twoReplicas) bCalls(n int) string {
	w.t.Helper()
	return w.bCallsOf(w.p, n)
}

// bCallsOf is bCalls of plugin p.
func (w *twoReplicas) bCallsOf(p *plugins.Plugin, n int) string {
	w.t.Helper()
	var got string
	for range n {
		c, err := w.bD.BeforeCall(w.ctx, w.key)
		if err != nil || c == nil {
			w.t.Fatalf("b: claim: %v %v", c, err)
		}
		l, err := w.bSes.Acquire(w.ctx, w.key, p)
		if err != nil {
			w.t.Fatal(err)
		}
		got = w.count(l)
		if why, err := w.bD.AfterCall(w.ctx, w.key, c, l, nil); err != nil || why != "" {
			w.t.Fatalf("b: checkpoint: %q %v", why, err)
		}
		l.Done(nil)
	}
	return got
}

// aCall runs p at replica a after BeforeCall succeeded, checkpoints it,
// and returns its count and the checkpoint's outcome.
func (w *twoReplicas) aCall(c *Claim) (string, NotSaved, error) {
	w.t.Helper()
	l := w.acquire(w.p)
	got := w.count(l)
	why, err := w.d.AfterCall(w.ctx, w.key, c, l, nil)
	l.Done(nil)
	return got, why, err
}

// eachLoss runs f for a claim reply lost both ways ("resent": go-redis
// sent the claim again; "deadline": its exchange timed out), each on a
// fresh pair of replicas where a made c and saved p once (count 1).
func eachLoss(t *testing.T, f func(t *testing.T, w *twoReplicas, c *Claim, resend bool)) {
	for _, resend := range []bool{true, false} {
		name := "deadline"
		if resend {
			name = "resent"
		}
		t.Run(name, func(t *testing.T) {
			w := newTwoReplicas(t)
			c := w.claim()
			w.callSaved(c, w.p) // a: 1, saved
			f(t, w, c, resend)
		})
	}
}

// A claim of replica a that steals the session back from b, whose reply
// is lost (or sent again by go-redis, whose resend answers as a's own
// claim), is not taken at a's next claim for a's own bump: the store's
// Taken names the claim a did not see answered, so verify reads the record
// again and a's instance, from before b's writes, is retired. With a
// "held already" flag in its place, the new fence was adopted without a
// read, and that instance was served and checkpointed over b's writes.
func TestClaimLostReplyIsNotOwnBump(t *testing.T) {
	eachLoss(t, func(t *testing.T, w *twoReplicas, c *Claim, resend bool) {
		d, ctx := w.d, w.ctx
		// b takes the session over (a is paused, or the proxy
		// flapped) and counts to 3, saved.
		if got := w.bCalls(2); got != "3" {
			t.Fatalf("b counts %s, want 3", got)
		}
		// The request comes back to a. Its claim steals the session
		// from b; the reply is lost.
		w.cs.resendClaim.Store(resend)
		w.cs.loseClaim.Store(true)
		if !resend {
			// Not within memoryGrace (else it is served from memory,
			// which is the documented 2 s window).
			ageClaim(c)
			if _, err := d.BeforeCall(ctx, w.key); err == nil {
				t.Fatal("a claim whose reply was lost succeeded")
			}
			d.downUntil.Store(0)
		}
		c2, err := d.BeforeCall(ctx, w.key)
		if err != nil || c2 != c {
			t.Fatalf("a: claim: %v %v", c2, err)
		}
		got, why, err := w.aCall(c2)
		t.Logf("a counts %s (checkpoint %q, %v)", got, why, err)
		if got != "4" {
			rec, _ := w.st.Store.Get(ctx, StoreID(w.key))
			t.Errorf("a served its instance from before b's writes: counts %s, want 4 (b saved 3); checkpoint %q %v; the store now holds %d bytes for p, written by a over b's", got, why, err, len(rec["p/p"]))
		}
	})
}

// The same through take: a forgotten claim is not resumed after a take
// whose claim stole the session from b and whose reply was lost (the
// failed take puts the forgotten claim back, and the next take's Taken is
// not the forgotten claim's), nor in one take whose claim go-redis sent
// again.
func TestForgottenClaimNotResumedAfterLostClaimReply(t *testing.T) {
	eachLoss(t, func(t *testing.T, w *twoReplicas, c *Claim, resend bool) {
		d, ctx := w.d, w.ctx
		d.forget(w.key, c) // a call that could be neither saved nor verified
		if got := w.bCalls(2); got != "3" {
			t.Fatalf("b counts %s, want 3", got)
		}
		w.cs.resendClaim.Store(resend)
		w.cs.loseClaim.Store(true)
		if !resend {
			if _, err := d.BeforeCall(ctx, w.key); err == nil {
				t.Fatal("a take whose claim's reply was lost succeeded")
			}
			d.downUntil.Store(0)
		}
		c2, err := d.BeforeCall(ctx, w.key)
		if err != nil || c2 == nil {
			t.Fatalf("a: claim: %v %v", c2, err)
		}
		got, why, err := w.aCall(c2)
		t.Logf("a counts %s (checkpoint %q, %v)", got, why, err)
		if got != "4" {
			t.Errorf("a resumed its forgotten claim over b's writes: counts %s, want 4 (b saved 3); checkpoint %q %v", got, why, err)
		}
	})
}

// A call's checkpoint fails unverified (its claim is forgotten), and
// before the host's l.Done(ErrMoved) another request of the session takes
// it again: no one claimed since, so it resumes, and its Seed keeps the
// call's instance (same fence) and drops the plugin's seed. Done then
// drops the instance and marks the plugin moved. The new claim stays (its
// verify finds its own fence and seeds nothing), so the plugin's next
// instance starts from what Keeper.Stored reads from the store. Waiting
// for the next Seed instead, every lease of the plugin failed with
// ErrMoved (-32053) for as long as no other replica claimed the session.
func TestMovedPluginStartsFromTheStore(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved
	l := w.acquire(w.p)
	w.count(l) // 2
	// The breaker is open, and the claim was verified long ago.
	ageClaim(c)
	d.downUntil.Store(int64(sinceBase() + time.Hour))
	if _, err := d.AfterCall(ctx, w.key, c, l, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("want errUnverified, got %v", err)
	}
	// The breaker closes; another request (of plugin q, say) takes the
	// session before l.Done runs.
	d.downUntil.Store(0)
	if c2, err := d.BeforeCall(ctx, w.key); err != nil || c2 == nil || c2 == c {
		t.Fatalf("take: %v %v", c2, err)
	}
	l.Done(sessions.ErrMoved) // host/call.go, after AfterCall's error
	// The client calls p again, and again: claimAndLease re-claims up to
	// three times per request.
	for req := range 3 {
		var err error
		for attempt := 0; attempt <= 3; attempt++ {
			if _, cerr := d.BeforeCall(ctx, w.key); cerr != nil {
				t.Fatal(cerr)
			}
			var l2 *sessions.Lease
			l2, err = w.ses.Acquire(ctx, w.key, w.p)
			if err == nil {
				got := w.count(l2)
				l2.Done(nil)
				if got != "2" {
					t.Errorf("p's next instance counts %s, want 2 (from the stored 1)", got)
				}
				return
			}
			if !errors.Is(err, sessions.ErrMoved) {
				t.Fatal(err)
			}
		}
		t.Logf("request %d: %v", req, err)
	}
	t.Fatal("p's leases fail with ErrMoved for good: no Seed comes, the session's claim being current")
}

// The store loses the session's record (evicted, expired, or the store
// came back empty); the next verify's claim makes a new, empty record, and
// its reply is lost (or go-redis sends it again). The claim after is not
// taken for this replica's own bump (Taken names the lost claim), so
// recover writes back what the store lost: the session's "mcp" record and
// q's state, acknowledged saved. With a "held already" flag, the new fence
// was adopted, recover never ran, and those fields stayed out of the store
// for good (putLocked skips a field whose digest it wrote).
func TestLostRecordRecoveredAfterLostClaimReply(t *testing.T) {
	for _, tc := range []struct {
		resend, flush bool
	}{{true, false}, {false, false}, {true, true}, {false, true}} {
		resend := tc.resend
		name := "deadline"
		if resend {
			name = "resent"
		}
		if tc.flush {
			name += "/store-back-empty"
		} else {
			name += "/record-evicted"
		}
		t.Run(name, func(t *testing.T) {
			w := newTwoReplicas(t)
			d, ctx := w.d, w.ctx
			c := w.claim()
			w.callSaved(c, w.p)
			w.callSaved(c, w.q) // q: 1, saved
			if tc.flush {
				w.st.Store.(*statestore.Memory).Flush()
			} else {
				w.st.Store.(*statestore.Memory).Expire(StoreID(w.key))
			}
			w.cs.resendClaim.Store(resend)
			w.cs.loseClaim.Store(true)
			if !resend {
				ageClaim(c)
				if _, err := d.BeforeCall(ctx, w.key); err == nil {
					t.Fatal("a claim whose reply was lost succeeded")
				}
				d.downUntil.Store(0)
			}
			if c2, err := d.BeforeCall(ctx, w.key); err != nil || c2 != c {
				t.Fatalf("claim: %v %v", c2, err)
			}
			if _, why, err := w.aCall(c); err != nil || why != "" {
				t.Fatalf("p: %q %v", why, err)
			}
			d.Wait() // recover's write-back, if any
			rec, err := w.st.Store.Get(ctx, StoreID(w.key))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"mcp", "p/q"} {
				if _, ok := rec[f]; !ok {
					t.Errorf("the store lost %q and it was never written back (fields now: %d)", f, len(rec))
				}
			}
		})
	}
}

// delayedPut is a store whose next put gets no answer and is held back,
// to land later (a write in flight when its exchange timed out).
type delayedPut struct {
	*lossyStore
	hold atomic.Bool
	late func()
}

func (s *delayedPut) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if s.hold.CompareAndSwap(true, false) {
		s.late = func() { s.lossyStore.Store.Put(context.Background(), id, field, v, fence, ttl) }
		return errNoAnswer
	}
	return s.lossyStore.Put(ctx, id, field, v, fence, ttl)
}

// A call that began under a claim later forgotten and resumed ends after
// the resume: its checkpoint, under the forgotten claim, writes nothing
// (the claim is retired: errMoved, and its call fails). Before, it got no
// answer and marked the forgotten claim dirty and the plugin unsaved, which
// the resumed claim, sharing the fence, never learnt: the resumed claim
// wrote the next state without bumping the fence, and the late write
// landed over it (the client had been told the newer state was saved).
func TestForgottenClaimWritesNothingAfterResume(t *testing.T) {
	w := newLossyWorld(t)
	dp := &delayedPut{lossyStore: w.st}
	w.d = New(Options{Store: dp, Sessions: w.ses, Replica: "a"})
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p)
	lq := w.acquire(w.q) // a long call on q, under c
	d.forget(w.key, c)   // another call of the session could be neither saved nor verified
	c2 := w.claim()      // resumed
	if c2 == c {
		t.Fatal("not a new claim")
	}
	if got := w.count(lq); got != "1" {
		t.Fatalf("q: %s", got)
	}
	dp.hold.Store(true)
	why, err := d.AfterCall(ctx, w.key, c, lq, nil)
	lq.Done(sessions.ErrMoved) // as the host does
	if !errors.Is(err, errMoved) || why != NotSavedMoved || !dp.hold.Load() {
		t.Fatalf("the checkpoint of the forgotten claim: %q %v (a write sent: %v); want moved, nothing written", why, err, !dp.hold.Load())
	}
	dp.hold.Store(false)
	// q goes on from the store (which holds none of it: the call failed).
	c3 := w.claim()
	l := w.acquire(w.q)
	if got := w.count(l); got != "1" {
		t.Fatalf("q after: %s, want 1", got)
	}
	if why, err := d.AfterCall(ctx, w.key, c3, l, nil); err != nil || why != "" {
		t.Fatalf("q: %q %v", why, err)
	}
	l.Done(nil)
}
