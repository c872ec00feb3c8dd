package sessions_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// slowWorld is a world of opts that also serves "slow", testplugins'
// slowstart: its start function runs at every instantiation, a restore's
// included, and a done context stops it, so that a lease whose context
// ends as the instance starts fails with ErrStart (a client giving up on
// its call while its state is restored). It returns a state saved from a
// fresh instance of slow.
func slowWorld(t *testing.T, opts sessions.Options) (*world, *plugins.State) {
	w := newWorld(t, opts)
	w.wasm = testplugins.Bytes(t, testplugins.Test(t, "slowstart"))
	w.version("slow", false)
	inst, err := w.plugin("slow").NewInstance(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(w.ctx)
	st, err := inst.SaveState(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return w, st
}

// roomWorld is a slowWorld of one instance at most, where a lease's
// context that failStart was given ends as the lease makes room (the
// Observer's close of the instance it evicts).
func roomWorld(t *testing.T) (*world, *plugins.State, *atomic.Pointer[context.CancelFunc]) {
	var cancelled atomic.Pointer[context.CancelFunc]
	w, good := slowWorld(t, sessions.Options{MaxInstances: 1})
	w.obs.onClose = func(string) {
		if f := cancelled.Load(); f != nil {
			(*f)()
		}
	}
	return w, good, &cancelled
}

// failStart asks for key's lease of slow under a context that cancel's
// caller cancels as the instance is about to start, and wants ErrStart.
func failStart(t *testing.T, w *world, key sessions.Key, cancelled *atomic.Pointer[context.CancelFunc]) {
	t.Helper()
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	cancelled.Store(&cancel)
	l, err := w.m.Acquire(ctx, key, w.plugin("slow"))
	cancelled.Store(nil)
	if err == nil {
		l.Done(nil)
	}
	if !errors.Is(err, sessions.ErrStart) {
		t.Fatalf("a lease whose context ended as its instance started: %v; want ErrStart", err)
	}
}

func resetOf(l *sessions.Lease) string {
	if r := l.Notice().Reset; r != nil {
		return r.Reason
	}
	return ""
}

// A lease whose instance does not start (its context ended during the
// restore) gives back the seed it took: the plugin's next instance starts
// from it, or says why not. It was dropped, the plugin counted started,
// and the next instance started afresh with no word: a seeded state lost
// unsaid (a bad one too: a state that does not restore is said as lost
// when an instance does start, as a Seed's Lost is). Here the context
// ends while the lease makes room (the one instance allowed is b's).
func TestFailedStartGivesSeedBack(t *testing.T) {
	for _, c := range []struct {
		name string
		seed func(good, bad *plugins.State) map[string]sessions.Seed
		want string // the reset of the instance that starts
	}{
		{"state", func(good, _ *plugins.State) map[string]sessions.Seed {
			return map[string]sessions.Seed{"slow": {State: good, Unsaid: "restored"}}
		}, "restored"},
		{"lost", func(_, _ *plugins.State) map[string]sessions.Seed {
			return map[string]sessions.Seed{"slow": {Lost: "not saved"}}
		}, sessions.ReasonReplicaLost},
		{"AnyPlugin", func(_, _ *plugins.State) map[string]sessions.Seed {
			return map[string]sessions.Seed{sessions.AnyPlugin: {Lost: "record lost", Reason: "record-lost"}}
		}, "record-lost"},
		{"bad state", func(_, bad *plugins.State) map[string]sessions.Seed {
			return map[string]sessions.Seed{"slow": {State: bad}}
		}, sessions.ReasonReplicaLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, good, cancelled := roomWorld(t)
			defer w.finish()
			other, err := w.plugin("counter").NewInstance(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			bad, err := other.SaveState(w.ctx) // another plugin's: it does not restore
			other.Close(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			a, b := sessions.Client("a"), sessions.Client("b")
			if err := w.m.Seed(a, c.seed(good, bad), 1); err != nil {
				t.Fatal(err)
			}
			if w.reset(b, "counter", nil) != "" {
				t.Fatal("b's fresh instance says a reset")
			}
			failStart(t, w, a, cancelled) // evicts b's, then its context ends
			l, err := w.m.Acquire(w.ctx, a, w.plugin("slow"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Done(nil)
			if got := resetOf(l); got != c.want {
				t.Fatalf("the instance after a start that failed: reset %q; want %q", got, c.want)
			}
		})
	}
}

// The same where the lease had asked Options.Stored for a moved
// instance's state: the next lease asks again. It started afresh, with no
// notice, the stored state neither read nor said lost (durable: the fresh
// instance's checkpoint wrote over it).
func TestFailedStartAsksStoredAgain(t *testing.T) {
	var cancelled atomic.Pointer[context.CancelFunc]
	var asked atomic.Int32
	var stored *plugins.State
	w, good := slowWorld(t, sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		asked.Add(1)
		if f := cancelled.Load(); f != nil {
			(*f)()
		}
		return stored, "", 1, true
	}})
	defer w.finish()
	stored = good
	a := sessions.Client("a")
	if err := w.m.Seed(a, nil, 1); err != nil {
		t.Fatal(err)
	}
	l, err := w.m.Acquire(w.ctx, a, w.plugin("slow"))
	if err != nil {
		t.Fatal(err)
	}
	l.Done(sessions.ErrMoved)
	failStart(t, w, a, &cancelled)
	l, err = w.m.Acquire(w.ctx, a, w.plugin("slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done(nil)
	if asked.Load() != 2 || resetOf(l) != "" {
		t.Fatalf("the instance after a start that failed: Stored asked %d times, reset %q; want 2, none", asked.Load(), resetOf(l))
	}
}

// The same where the lease had asked Options.Saved for an evicted
// instance's state, which cleared the eviction's notice: the next lease
// asks again. It started afresh, with no notice, the saved state neither
// read nor said lost. A Seed or an Adopt while the start that fails runs
// (here as Saved is asked) decides as it does for an instance that
// starts: under another claim's fence its seed stands (the instance would
// have been stale); under the starting instance's fence, or adopted, the
// instance's source was kept over the seed, and it is given back.
func TestFailedStartAsksSavedAgain(t *testing.T) {
	lost := map[string]sessions.Seed{"slow": {Lost: "stands for an older state", Reason: "seeded"}}
	for _, c := range []struct {
		name   string
		during func(m *sessions.Manager, k sessions.Key) error
		asked  int32
		reset  string
	}{
		{"alone", nil, 2, ""},
		{"another claim", func(m *sessions.Manager, k sessions.Key) error { return m.Seed(k, lost, 7) }, 1, "seeded"},
		{"the same fence", func(m *sessions.Manager, k sessions.Key) error { return m.Seed(k, lost, 0) }, 2, ""},
		{"adopted", func(m *sessions.Manager, k sessions.Key) error { m.Adopt(k, 0, 5); return nil }, 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := evictedSlowWorld(t, func(w *world) {
				if c.during == nil {
					return
				}
				if err := c.during(w.m, sessions.Client("a")); err != nil {
					t.Error(err)
				}
			})
			defer e.w.finish()
			failStart(t, e.w, e.a, &e.cancelled)
			l, err := e.w.m.Acquire(e.w.ctx, e.a, e.w.plugin("slow"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Done(nil)
			if e.asked.Load() != c.asked || resetOf(l) != c.reset {
				t.Fatalf("the instance after a start that failed: Saved asked %d times, reset %q; want %d, %q", e.asked.Load(), resetOf(l), c.asked, c.reset)
			}
		})
	}
}

// evictedSlow is a slowWorld of one instance at most whose Options.Saved
// gives a state of slow, where client a's instance of slow was evicted by
// b's of counter.
type evictedSlow struct {
	w *world
	a sessions.Key
	// cancelled, if set, is called by Saved, after during.
	cancelled atomic.Pointer[context.CancelFunc]
	asked     atomic.Int32 // Saved's calls
}

// evictedSlowWorld makes an evictedSlow whose Saved calls during before
// it cancels a lease's context.
func evictedSlowWorld(t *testing.T, during func(w *world)) *evictedSlow {
	e := &evictedSlow{a: sessions.Client("a")}
	var saved *plugins.State
	e.w, saved = slowWorld(t, sessions.Options{MaxInstances: 1, Saved: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
		e.asked.Add(1)
		if f := e.cancelled.Load(); f != nil {
			during(e.w)
			(*f)()
		}
		return saved, "", true
	}})
	e.w.reset(e.a, "slow", nil)
	e.w.reset(sessions.Client("b"), "counter", nil) // evicts a's
	return e
}

// A Seed under the client's fence that comes once a start that failed
// gave back what it took, but before its lease let the slot go, finds
// the slot still starting: it dropped the plugin's seed, its own and the
// one given back, as it does for an instance that goes on, and counted
// the plugin started, though no instance started. The next instance
// started afresh with no word: a seeded state lost unsaid (durable:
// resume and announceLost seed under the client's fence, and the fresh
// instance's checkpoint writes over the record's state).
func TestSeedAfterFailedStartStands(t *testing.T) {
	w, good, cancelled := roomWorld(t)
	defer w.finish()
	a, b := sessions.Client("a"), sessions.Client("b")
	if err := w.m.Seed(a, map[string]sessions.Seed{"slow": {State: good, Unsaid: "restored"}}, 1); err != nil {
		t.Fatal(err)
	}
	if w.reset(b, "counter", nil) != "" {
		t.Fatal("b's fresh instance says a reset")
	}
	w.m.SetGaveBack(func() {
		w.m.SetGaveBack(nil)
		if err := w.m.Seed(a, map[string]sessions.Seed{"slow": {Lost: "the record's", Reason: "seeded"}}, 1); err != nil {
			t.Error(err)
		}
	})
	failStart(t, w, a, cancelled) // evicts b's, then its context ends
	l, err := w.m.Acquire(w.ctx, a, w.plugin("slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done(nil)
	if got := resetOf(l); got != "seeded" {
		t.Fatalf("the instance after a start that failed, then a Seed: reset %q; want %q (the Seed's)", got, "seeded")
	}
}
