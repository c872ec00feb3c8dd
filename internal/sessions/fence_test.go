package sessions_test

import (
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
