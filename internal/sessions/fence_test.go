package sessions_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
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
// leaves the client's state in the store: the plugin's next instance,
// unless a Seed came since, starts from what Options.Stored reads from
// the store, and the lease fails with ErrMoved while it cannot tell. The
// old code started a fresh instance, and its checkpoint wrote an empty
// state over the stored one (TestRacingTakeoversLoseNoUpdate, about one
// run in a hundred under load); then, asked to wait for the next Seed, a
// session whose claim was current waited for good (a Seed that came
// during the call and kept the instance going had dropped its seed).
func TestMovedClientStartsOnlyFromTheStore(t *testing.T) {
	var known atomic.Bool
	var asked atomic.Int32
	var under atomic.Uint64 // the fence the client is seeded under
	w := newWorld(t, sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		asked.Add(1)
		return nil, "", under.Load(), known.Load()
	}})
	defer w.finish()
	k := sessions.Client("c1")
	if err := w.m.Seed(k, nil, 1); err != nil {
		t.Fatal(err)
	}
	under.Store(1)
	l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	if l, err := w.m.Acquire(w.ctx, k, w.plugin("counter")); !errors.Is(err, sessions.ErrMoved) || asked.Load() != 1 {
		if err == nil {
			l.Done(nil)
		}
		t.Fatalf("a lease after the move, the store not telling: %v (Stored asked %d times); want ErrMoved", err, asked.Load())
	}
	// The store tells (it holds nothing for the plugin): a fresh start.
	known.Store(true)
	l, err = w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatalf("a lease after the move, the store telling: %v", err)
	}
	// Seeded again under the same fence while the call runs: the
	// instance is kept and its seed dropped (a later eviction must not
	// roll it back to the seed); a move after it asks the store again.
	if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "stands for a stored state"}}, 1); err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	known.Store(false)
	if l, err := w.m.Acquire(w.ctx, k, w.plugin("counter")); !errors.Is(err, sessions.ErrMoved) || asked.Load() != 3 {
		if err == nil {
			l.Done(nil)
		}
		t.Fatalf("a lease after a move that a Seed keeping the instance overtook: %v (Stored asked %d times); want ErrMoved", err, asked.Load())
	}
	// A Seed after the move speaks for the plugin: no store asked.
	if err := w.m.Seed(k, nil, 2); err != nil {
		t.Fatal(err)
	}
	l, err = w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil || asked.Load() != 3 {
		t.Fatalf("a lease after the next Seed: %v (Stored asked %d times)", err, asked.Load())
	}
	l.Done(nil)
}

// An instance evicted for room whose saved state Options.Saved cannot
// read now (known false) is not started afresh: the lease fails with
// ErrMoved (retryable; nothing ran), the slot keeps its eviction, and the
// next lease asks again. Before stop 57, Saved had no way to say so, and
// a store read that failed started the plugin afresh, told "evicted",
// its next checkpoint writing over the saved state
// (durable's TestEvictedRestoreWithLostReadKeepsState).
func TestEvictedClientWaitsForSaved(t *testing.T) {
	var known atomic.Bool
	var asked atomic.Int32
	w, a := evictedWorld(t, func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
		asked.Add(1)
		return nil, "", known.Load()
	})
	defer w.finish()
	if l, err := w.m.Acquire(w.ctx, a, w.plugin("counter")); !errors.Is(err, sessions.ErrMoved) || asked.Load() != 1 {
		if err == nil {
			l.Done(nil)
		}
		t.Fatalf("a lease after the eviction, Saved not telling: %v (asked %d times); want ErrMoved", err, asked.Load())
	}
	known.Store(true) // it tells: nothing saved
	l, err := w.m.Acquire(w.ctx, a, w.plugin("counter"))
	if err != nil || asked.Load() != 2 {
		t.Fatalf("a lease after the eviction, Saved telling: %v (asked %d times)", err, asked.Load())
	}
	defer l.Done(nil)
	if r := l.Notice().Reset; r == nil || r.Reason != sessions.ReasonEvicted {
		t.Fatalf("the fresh start's reset: %+v, want %q", r, sessions.ReasonEvicted)
	}
}

// Adopt keeps the instances a client started under no claim (fence 0: a
// session served from memory before its first claim), busy ones too,
// under the new claim's fence: they are not stale, and a busy lease's
// state is written under that fence. A client seeded under another fence
// is left as it is.
func TestAdoptKeepsInstancesOfNoClaim(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	k := sessions.Client("c1")
	l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	first := l.Instance()
	if kept := w.m.Adopt(k, 7, 9); kept != nil || w.m.Fence(k) != 0 {
		t.Fatalf("Adopt from a fence the client is not seeded under: kept %v, fence %d", kept, w.m.Fence(k))
	}
	if kept := w.m.Adopt(k, 0, 5); len(kept) != 1 || kept[0] != "counter" {
		t.Fatalf("Adopt kept %v, want [counter]", kept)
	}
	if l.Stale() || l.Fence() != 5 {
		t.Fatalf("the busy lease after Adopt: stale %v, fence %d; want false, 5", l.Stale(), l.Fence())
	}
	l.Done(nil)
	l2, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Done(nil)
	if l2.Instance() != first || l2.Fence() != 5 || l2.Stale() {
		t.Fatalf("after Adopt: same instance %v, fence %d, stale %v", l2.Instance() == first, l2.Fence(), l2.Stale())
	}
}

// An instance that starts while Adopt moves its client from fence 0 (the
// lease read the fence, and starts the instance outside the manager's
// lock) is the adopted fence's, as one started a moment earlier would
// be: its lease is not stale, Adopt names it kept (its state is written
// by the next checkpoint), and the next lease keeps it. It recorded
// fence 0: its lease was stale, and the next lease dropped the instance
// as of another owner, what its call did lost without a notice. Adopt
// runs here where the lease restarts an evicted instance (Options.Saved
// is asked between the two), the gap every new instance starts in.
func TestAdoptWhileInstanceStarts(t *testing.T) {
	var during func()
	w, a := startingWorld(t, &during)
	defer w.finish()
	var kept []string
	during = func() { kept = w.m.Adopt(a, 0, 5) }
	l, err := w.m.Acquire(w.ctx, a, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	during = nil
	first, stale, fence := l.Instance(), l.Stale(), l.Fence()
	l.Done(nil)
	if stale || fence != 5 || len(kept) != 1 || kept[0] != "counter" {
		t.Fatalf("a lease whose instance started during Adopt: stale %v, fence %d, kept %v; want false, 5, [counter]", stale, fence, kept)
	}
	l, err = w.m.Acquire(w.ctx, a, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done(nil)
	if l.Instance() != first || l.Fence() != 5 || l.Stale() || l.Notice().Reset != nil {
		t.Fatalf("the next lease: same instance %v, fence %d, stale %v, reset %+v; want true, 5, false, none", l.Instance() == first, l.Fence(), l.Stale(), l.Notice().Reset)
	}
}

// Only Adopt moves a starting instance on: one that finishes starting
// after its client was adopted and then seeded under another claim's
// fence (another replica took the session over) is stale, as is one
// whose client was seeded anew without Adopt; one whose client is
// seeded again under the adopted fence (the claim's own Seed, which
// follows its Adopt) is not.
func TestSeedDuringStartAfterAdopt(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps func(m *sessions.Manager, k sessions.Key)
		stale bool
	}{
		{"adopt then another claim", func(m *sessions.Manager, k sessions.Key) {
			m.Adopt(k, 0, 5)
			m.Seed(k, nil, 7)
		}, true},
		{"another claim", func(m *sessions.Manager, k sessions.Key) { m.Seed(k, nil, 7) }, true},
		{"adopt then its own seed", func(m *sessions.Manager, k sessions.Key) {
			m.Adopt(k, 0, 5)
			m.Seed(k, nil, 5)
		}, false},
		{"adopt twice", func(m *sessions.Manager, k sessions.Key) {
			m.Adopt(k, 0, 5)
			m.Adopt(k, 5, 6)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var during func()
			w, a := startingWorld(t, &during)
			defer w.finish()
			during = func() { c.steps(w.m, a) }
			l, err := w.m.Acquire(w.ctx, a, w.plugin("counter"))
			if err != nil {
				t.Fatal(err)
			}
			during = nil
			first, stale := l.Instance(), l.Stale()
			l.Done(nil)
			if stale != c.stale {
				t.Fatalf("stale %v, want %v", stale, c.stale)
			}
			l, err = w.m.Acquire(w.ctx, a, w.plugin("counter"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Done(nil)
			if (l.Instance() == first) == c.stale || l.Stale() {
				t.Fatalf("the next lease: same instance %v, stale %v", l.Instance() == first, l.Stale())
			}
		})
	}
}

// A Seed under the fence an instance is starting under (a claim of this
// replica's own: durable's resume, announceLost) leaves that instance
// going, as it does one that has started: the plugin's seed is dropped
// and the plugin counts as started since, so that once the instance is
// evicted its next one asks Options.Saved, which knows what its calls
// saved, rather than start from the seed (older: a silent rollback) or
// from an AnyPlugin seed. Under another fence the instance is stale and
// the seed stands. Forced where the lease restarts an evicted instance
// (Saved is asked in the gap); after it, a's instance is evicted again.
func TestSeedDuringStartSameFence(t *testing.T) {
	lost := sessions.Seed{Lost: "stands for an older saved state", Reason: "seeded"}
	for _, c := range []struct {
		name   string
		seeds  map[string]sessions.Seed
		fence  uint64
		stale  bool
		reason string // the reset of a's instance after the eviction
	}{
		{"the plugin's seed", map[string]sessions.Seed{"counter": lost}, 0, false, sessions.ReasonEvicted},
		{"AnyPlugin", map[string]sessions.Seed{sessions.AnyPlugin: lost}, 0, false, sessions.ReasonEvicted},
		{"another claim", map[string]sessions.Seed{"counter": lost}, 7, true, "seeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var during func()
			w, a := startingWorld(t, &during)
			defer w.finish()
			during = func() {
				if err := w.m.Seed(a, c.seeds, c.fence); err != nil {
					t.Error(err)
				}
			}
			l, err := w.m.Acquire(w.ctx, a, w.plugin("counter"))
			if err != nil {
				t.Fatal(err)
			}
			during = nil
			stale := l.Stale()
			l.Done(nil)
			if stale != c.stale {
				t.Fatalf("stale %v, want %v", stale, c.stale)
			}
			l, err = w.m.Acquire(w.ctx, sessions.Client("b"), w.plugin("counter")) // evicts a's
			if err != nil {
				t.Fatal(err)
			}
			l.Done(nil)
			var asked int
			during = func() { asked++ }
			l, err = w.m.Acquire(w.ctx, a, w.plugin("counter"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Done(nil)
			var reason string
			if r := l.Notice().Reset; r != nil {
				reason = r.Reason
			}
			if want := map[bool]int{false: 1, true: 0}[c.stale]; reason != c.reason || asked != want {
				t.Fatalf("a's instance after the eviction: reset %q, Saved asked %d times; want %q, %d", reason, asked, c.reason, want)
			}
		})
	}
}

// evictedWorld is a world of one instance at most, asking saved for an
// evicted instance's state, where client a's instance of counter was
// evicted by client b's (which is idle); it returns a's key.
func evictedWorld(t *testing.T, saved func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool)) (*world, sessions.Key) {
	w := newWorld(t, sessions.Options{MaxInstances: 1, Saved: saved})
	a, b := sessions.Client("a"), sessions.Client("b")
	for _, k := range []sessions.Key{a, b} { // b's evicts a's
		l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	return w, a
}

// startingWorld is an evictedWorld whose a's next lease calls *during,
// if set, between reading its client's fence and starting its instance
// afresh (nothing saved).
func startingWorld(t *testing.T, during *func()) (*world, sessions.Key) {
	return evictedWorld(t, func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
		if *during != nil {
			(*during)()
		}
		return nil, "", true
	})
}
