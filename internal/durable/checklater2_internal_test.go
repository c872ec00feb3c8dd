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
	c, err := d.BeforeCall(ctx, w.key)
	if err != nil || c == nil {
		w.t.Fatalf("claim: %v %v", c, err)
	}
	l := w.acquire(w.p)
	got := w.count(l)
	why, err := d.AfterCall(ctx, w.key, c, l, nil)
	l.Done(err)
	return got, why, err
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

// landPutStore applies the next armed "p/" Put and loses its answer (a
// Redis script that ran after its caller gave up).
type landPutStore struct {
	statestore.Store
	armed atomic.Bool
}

func (s *landPutStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if strings.HasPrefix(field, "p/") && s.armed.CompareAndSwap(true, false) {
		if err := s.Store.Put(ctx, id, field, v, fence, ttl); err != nil {
			return err
		}
		return errNoAnswer
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
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
	lp := &landPutStore{Store: w.st.Store}
	w.st.Store = lp
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	w.callSaved(c, w.q) // q: 1
	// X: p, unchecked.
	started := time.Now()
	cx := d.CheckLater(w.key)
	if cx == nil {
		t.Fatal("CheckLater: no claim")
	}
	lX := w.acquire(w.p)
	if got := w.count(lX); got != "2" {
		t.Fatalf("X counts %s", got)
	}
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
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("next call: claim: %v %v", c2, err)
	}
	l := w.acquire(w.p)
	got := w.count(l)
	if r := l.Notice().Reset; r != nil {
		t.Errorf("next call: p reset (%s: %s)", r.Reason, r.Detail)
	}
	why, err = d.AfterCall(ctx, w.key, c2, l, nil)
	l.Done(err)
	if got != "3" || err != nil {
		t.Fatalf("next call counts %s (%q %v), want 3: X's effect kept once", got, why, err)
	}
}

// hookPutStore applies the next armed "p/" Put, runs after, and loses the
// Put's answer as a stalled exchange (this process paused while it was in
// flight: the breaker stays closed).
type hookPutStore struct {
	statestore.Store
	armed atomic.Bool
	after func()
}

func (s *hookPutStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if strings.HasPrefix(field, "p/") && s.armed.CompareAndSwap(true, false) {
		if err := s.Store.Put(ctx, id, field, v, fence, ttl); err != nil {
			return err
		}
		s.after()
		return &stalledError{errNoAnswer}
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
	hp := &hookPutStore{Store: w.st.Store}
	w.st.Store = hp
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // p: 1
	started := time.Now()
	cx := d.CheckLater(w.key)
	if cx == nil {
		t.Fatal("CheckLater: no claim")
	}
	lX := w.acquire(w.p)
	if got := w.count(lX); got != "2" {
		t.Fatalf("X counts %s", got)
	}
	var bGot string
	hp.after = func() { bGot = w.bCalls(1) }
	hp.armed.Store(true)
	why, err := d.AfterUncheckedCall(ctx, w.key, cx, lX, nil, started)
	if !errors.Is(err, ErrOutcomeUnknown) || bGot != "3" {
		t.Fatalf("X: %q %v (b counted %s), want ErrOutcomeUnknown", why, err, bGot)
	}
	lX.Done(nil)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("next call: claim: %v %v", c2, err)
	}
	l := w.acquire(w.p)
	got := w.count(l)
	why, err = d.AfterCall(ctx, w.key, c2, l, nil)
	l.Done(err)
	if got != "4" || err != nil {
		t.Fatalf("a's next call counts %s (%q %v), want 4: one increment on b's 3", got, why, err)
	}
}
