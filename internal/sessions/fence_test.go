package sessions_test

import (
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// Issue #25, findings 1 and 2: the fence an instance was seeded under is
// the instance's. A change of owner (a Seed under a new fence) retires
// every instance of the old fence: an idle one at once, a busy one when
// its lease is done, and the busy lease knows it is stale, so its state is
// never written under the new fence.
func TestSeedRetiresInstancesOfAnotherFence(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	k := sessions.Client("c1")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.m.Seed(k, nil, 1))
	l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	must(err)
	if l.Fence() != 1 || l.Stale() {
		t.Fatalf("lease fence %d stale %v, want 1, false", l.Fence(), l.Stale())
	}
	first := l.Instance()
	// Another replica served the session; this one claims it again with
	// fence 3 while the call runs.
	must(w.m.Seed(k, nil, 3))
	if !l.Stale() {
		t.Fatal("a busy lease of the old fence is not stale")
	}
	l.Done(nil)
	l2, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	must(err)
	defer l2.Done(nil)
	if l2.Instance() == first || l2.Fence() != 3 || l2.Stale() {
		t.Fatalf("after the change of owner: same instance %v, fence %d, stale %v", l2.Instance() == first, l2.Fence(), l2.Stale())
	}
}

// A lease done with ErrMoved (its session was taken over during the call)
// leaves the client's state in the store: a lease that came with a claim
// from before the move, and would start an instance without a seed, fails
// with ErrMoved until the client is seeded again. The old code started a
// fresh instance, and its checkpoint wrote an empty state over the
// stored one (TestRacingTakeoversLoseNoUpdate, about one run in a
// hundred under load).
func TestMovedClientStartsOnlyFromASeed(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	k := sessions.Client("c1")
	if err := w.m.Seed(k, nil, 1); err != nil {
		t.Fatal(err)
	}
	l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	if l, err := w.m.Acquire(w.ctx, k, w.plugin("counter")); !errors.Is(err, sessions.ErrMoved) {
		if err == nil {
			l.Done(nil)
		}
		t.Fatalf("a lease after the move, before a seed: %v; want ErrMoved", err)
	}
	if err := w.m.Seed(k, nil, 2); err != nil {
		t.Fatal(err)
	}
	l, err = w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatalf("a lease after the client was seeded again: %v", err)
	}
	// Seeded again while a call that is to end moved still runs (another
	// request took the session over from the store meanwhile): the new
	// seed stands, and a later lease starts without one.
	if err := w.m.Seed(k, nil, 3); err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	l, err = w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatalf("a lease after a move that a seed overtook: %v", err)
	}
	// Seeded again under the same fence while the call runs (this
	// replica claimed the session again, and no one else had): the
	// instance is kept and its seed dropped (a later eviction must not
	// roll it back to the seed), so that Seed does not speak for it: a
	// move after it is marked, and only the next Seed lets it start.
	if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "stands for a stored state"}}, 3); err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	if l, err := w.m.Acquire(w.ctx, k, w.plugin("counter")); !errors.Is(err, sessions.ErrMoved) {
		if err == nil {
			l.Done(nil)
		}
		t.Fatalf("a lease after a move that a seed keeping the instance overtook: %v; want ErrMoved", err)
	}
	if err := w.m.Seed(k, nil, 4); err != nil {
		t.Fatal(err)
	}
	l, err = w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatalf("a lease after the next seed: %v", err)
	}
	l.Done(nil)
}
