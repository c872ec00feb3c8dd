package durable

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// runContained runs p's counter as the host runs a contained call: under
// CheckLater's claim when there is one (run again, claimed first, on
// ErrRunAgain), else claimed first. It returns the count sent.
func (w *lossyWorld) runContained() (string, NotSaved, error) {
	w.t.Helper()
	d, ctx := w.d, w.ctx
	started := time.Now()
	if c := d.CheckLater(w.key); c != nil {
		l := w.acquire(w.p)
		got := w.count(l)
		why, err := d.AfterUncheckedCall(ctx, w.key, c, l, nil, started)
		if !errors.Is(err, ErrRunAgain) {
			if err != nil {
				l.Done(sessions.ErrMoved)
			} else {
				l.Done(nil)
			}
			return got, why, err
		}
		l.Done(sessions.ErrMoved)
	}
	got, _ := w.claimedCall(w.p)
	return got, "", nil
}

// The store evicted the session's record (same epoch). a's contained
// call's write is refused as lost; relost claims the session (a new
// fence, no previous holder) and its read of the record gets no answer.
// A review found the claim then handed out unchecked again: the next
// call's write was refused as fenced by a's own relost claim, the claim
// forgotten, and the run again seeded the counter, held only by a, from
// the empty record, silently. Now the claim is checked first after a
// call that could not check it (Claim.recheck): verify reads the record,
// finds no one wrote, and writes back what a holds.
func TestRelostUnreadRecordKeepsState(t *testing.T) {
	w := newLossyWorld(t)
	d := w.d
	c := w.claim()
	w.callSaved(c, w.p) // 1
	w.callSaved(c, w.p) // 2
	w.st.Store.(*statestore.Memory).Expire(c.id)
	w.st.loseGet.Store(true) // relost's read gets no answer
	got, why, err := w.runContained()
	t.Logf("call 3: %s %q %v", got, why, err)
	if got != "3" {
		t.Fatalf("call 3 counts %s", got)
	}
	d.downUntil.Store(0) // the breaker closes (2 s later)
	got, why, err = w.runContained()
	if err != nil || got != "4" {
		t.Fatalf("call 4 counts %s (%q %v), want 4: a held the only copy of the state (3), and no one else claimed the session", got, why, err)
	}
}

// A contained call X of p runs unchecked; meanwhile a call Y of q of the
// same session could be neither saved nor verified (the store away, the
// claim verified over 2 s before): Y forgot the claim. X's write then
// lands but its answer is lost. A review found X run again (ErrRunAgain),
// on top of its landed write, or with p reset as not saved. X's outcome
// is unknown now (ErrOutcomeUnknown): it is not run again, its instance
// is kept, and the session's next call (claimed first, resuming the
// claim: no one claimed since) goes on from it, with no reset.
func TestUncheckedCallForgottenAfterLostAnswerIsNotRunAgain(t *testing.T) {
	w := newLossyWorld(t)
	lp := &lostAnswerStore{Store: w.st.Store}
	w.st.Store = lp
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	w.callSaved(c, w.q) // q: 1
	// X: p, unchecked.
	cx, lX, started := w.unchecked(w.p, "2")
	// Y: q, under the same claim, can be neither saved nor verified.
	ageClaim(c)
	lY := w.acquire(w.q)
	w.count(lY)
	d.downUntil.Store(int64(sinceBase() + breakerWindow))
	if _, err := d.AfterCall(ctx, w.key, c, lY, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("Y: %v, want errUnverified", err)
	}
	lY.Done(sessions.ErrMoved)
	d.downUntil.Store(0) // the store answers again
	// X's write lands; its answer is lost.
	lp.armed.Store(true)
	why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, nil, started)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("X: %q %v, want ErrOutcomeUnknown", why, err)
	}
	lX.Done(nil)         // kept, as the host does
	d.downUntil.Store(0) // the breaker the lost answer opened closes (2 s later)
	got, reset := w.claimedCall(w.p)
	if reset != nil {
		t.Errorf("next call: p reset (%s: %s)", reset.Reason, reset.Detail)
	}
	if got != "3" {
		t.Fatalf("next call counts %s, want 3: X's effect kept once", got)
	}
}

// lostAnswerStore applies the next armed "p/" Put, runs after (if set),
// and loses the Put's answer (a Redis script that ran after its caller
// gave up); stalled: lost as a stalled exchange (this process paused while
// it was in flight: the breaker stays closed).
type lostAnswerStore struct {
	statestore.Store
	armed   atomic.Bool
	after   func()
	stalled bool
}

func (s *lostAnswerStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if strings.HasPrefix(field, "p/") && s.armed.CompareAndSwap(true, false) {
		if err := s.Store.Put(ctx, id, field, v, fence, ttl); err != nil {
			return err
		}
		if s.after != nil {
			s.after()
		}
		if s.stalled {
			return &stalledError{errNoAnswer}
		}
		return errNoAnswer
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

// A contained call X at a writes its state (count 2); the write lands but
// its answer is lost. Before X checks its claim, b serves the session (it
// reads X's write: 3). X's check (verify) finds the session moved. A
// review found X run again on the store's state, which held its first
// run (4 after two increments of X's). A call whose own write may have
// landed is not run again: its outcome is unknown, and a's next call
// goes on from b's state.
func TestUncheckedCallWhoseWriteMayHaveLandedIsNotRunAgain(t *testing.T) {
	w := newTwoReplicas(t)
	hp := &lostAnswerStore{Store: w.st.Store, stalled: true}
	w.st.Store = hp
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	cx, lX, started := w.unchecked(w.p, "2")
	var bGot string
	hp.after = func() { bGot = w.bCalls(1) }
	hp.armed.Store(true)
	why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, nil, started)
	if !errors.Is(err, ErrOutcomeUnknown) || bGot != "3" {
		t.Fatalf("X: %q %v (b counted %s), want ErrOutcomeUnknown", why, err, bGot)
	}
	lX.Done(nil)
	if got, _ := w.claimedCall(w.p); got != "4" {
		t.Fatalf("a's next call counts %s, want 4: one increment on b's 3", got)
	}
}
