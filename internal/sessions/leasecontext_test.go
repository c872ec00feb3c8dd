package sessions_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestLeaseOfPluginThatNeverWaitsAllocates: a lease of a plugin whose
// calls never wait for a person (Options.Waits) runs its guest under the
// context it was acquired with, not under a cancellable layer of its own
// that nothing but its parent or its Done would cancel: eviction and Close
// cancel only leases waiting for a person (issue 27, item 2). On a warm
// instance, acquiring and ending it under a fresh cancellable context, as
// each request's is, allocates that context (its context and cancel, and
// its Done channel) and the Lease alone; with a layer of its own, four more
// (its context, its cancel and its parent's map of children), and a guest
// call under it one more (the layer's Done channel, which the sandbox's
// watch on it makes). A lease of a plugin that may wait keeps its own,
// which its eviction cancels.
func TestLeaseOfPluginThatNeverWaitsAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	never := newWorld(t, sessions.Options{Waits: func(*plugins.Plugin) bool { return false }})
	defer never.finish()
	may := newWorld(t, sessions.Options{})
	defer may.finish()
	var conn int
	key := sessions.Conn(&conn, "conn", "conn") // as the host's sessions' are
	lease := func(w *world, call bool) {
		parent, cancel := context.WithCancel(w.ctx)
		defer cancel()
		l, err := w.m.Acquire(parent, key, w.plugin("counter"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Done(nil)
		if (l.Context() == parent) != (w == never) {
			t.Errorf("the lease's context is its parent: %v; want %v", l.Context() == parent, w == never)
		}
		if call {
			if _, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: l.Plugin().Tools()[0], Arguments: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, w := range []*world{never, may} {
		lease(w, true) // the instance started, warm
	}
	// The least of a few measurements: another goroutine's allocations
	// meanwhile (a loaded machine's timers, the collector's) only add, and
	// a guest call's count rose by 1 to 4 in about one run in four under
	// load, which a difference of 5 cannot absorb.
	allocs := func(f func()) float64 {
		least := testing.AllocsPerRun(300, f)
		for range 4 {
			least = min(least, testing.AllocsPerRun(300, f))
		}
		return least
	}
	bare := allocs(func() { lease(never, false) })
	if bare > 4 {
		t.Errorf("a warm lease of a plugin that never waits, acquired and done under a fresh cancellable context: %v allocations; want at most 4 (that context's 3 and the Lease)", bare)
	}
	layered := allocs(func() { lease(may, false) })
	if layered-bare < 4 {
		t.Errorf("a lease of a plugin that may wait: %v allocations, %v without its context's layer; want 4 more", layered, bare)
	}
	called := allocs(func() { lease(never, true) })
	calledLayered := allocs(func() { lease(may, true) })
	if calledLayered-called < 5 {
		t.Errorf("a warm lease with a guest call: %v allocations, %v with the lease's own layer; want 5 fewer without it", called, calledLayered)
	}
	t.Logf("acquire and done: %v, with a layer %v; with a call: %v, with a layer %v", bare, layered, called, calledLayered)
}
