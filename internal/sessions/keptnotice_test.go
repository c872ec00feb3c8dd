package sessions_test

import (
	"context"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// A notice kept for a call whose client may have given up on it
// (KeepNoticeSince: its request sat in a stopped process) is said again
// by the client's next call, but not kept again by a call whose request
// arrived after the keeping lease was done: the host asks every call
// within 5 s of a stop to keep its notice, and each kept the same reset
// for the next, so that a client saw one reset said by all its calls of
// those seconds (and one that re-seeds its state on a reset re-seeded it
// at each). A call whose request arrived before (in the process beside the
// one that kept it, given up as well, maybe) keeps it again.
func TestKeptNoticeNotKeptAgain(t *testing.T) {
	for _, c := range []struct {
		name string
		// arrivedEarly: the second request arrived before the first
		// lease was done.
		arrivedEarly bool
		want         []string
	}{
		{"next call arrived after the keeper was done", false, []string{"store-lost", "store-lost", "", ""}},
		{"next call arrived while the keeper ran", true, []string{"store-lost", "store-lost", "store-lost", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, sessions.Options{})
			defer w.finish()
			k := sessions.Client("c1")
			if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "the store lost it", Reason: "store-lost"}}, 1); err != nil {
				t.Fatal(err)
			}
			// Every request arrived within the stop's window: the host
			// asks each lease to keep its notice.
			arrived := time.Now()
			for i, want := range c.want {
				got := w.reset(k, "counter", func(l *sessions.Lease) { l.KeepNoticeSince(arrived) })
				if got != want {
					t.Errorf("lease %d: reset %q, want %q", i+1, got, want)
				}
				if !(c.arrivedEarly && i == 0) {
					arrived = time.Now() // the next request's, after Done
				}
			}
		})
	}
}

// TestKeptNoticeAgainKeepsItsTime: a notice kept (at t1), then kept again
// by a call that arrived before t1 (at t2), was marked kept at t2: a call
// whose request arrived between t1 and t2, after the notice was first
// kept, kept it once more, and the client's next call said the one reset
// a fourth time. A notice kept again is kept as of when it was first kept.
func TestKeptNoticeAgainKeepsItsTime(t *testing.T) {
	w, k := storeLostWorld(t)
	defer w.finish()
	early := time.Now() // a and b: requests that sat in the stopped process
	var late time.Time  // c: read after a kept the notice, before b did
	for i, step := range []struct {
		name string
		when *time.Time
		want string
	}{{"a", &early, "store-lost"}, {"b", &early, "store-lost"}, {"c", &late, "store-lost"}, {"d", nil, ""}} {
		var keep func(*sessions.Lease)
		if step.when != nil {
			keep = func(l *sessions.Lease) { l.KeepNoticeSince(*step.when) }
		}
		if got := w.reset(k, "counter", keep); got != step.want {
			t.Errorf("lease %d (%s): reset %q, want %q", i+1, step.name, got, step.want)
		}
		if step.name == "a" {
			late = time.Now()
		}
	}
}

// TestKeptNoticeThroughCancelledFirstCall: a kept notice (at t1) taken by
// the cancelled first call of an instance started afresh (its slot's
// instance stale and dropped meanwhile) goes back to the slot unheard, as
// kept at t1 still: a call whose request arrived after t1 says it and
// does not keep it again, and the one after says nothing. Given back
// without its time, it was kept again, and said a third time.
func TestKeptNoticeThroughCancelledFirstCall(t *testing.T) {
	w, k := storeLostWorld(t)
	defer w.finish()
	arrived := time.Now()
	if got := w.reset(k, "counter", func(l *sessions.Lease) { l.KeepNoticeSince(arrived) }); got != "store-lost" {
		t.Fatalf("first lease: reset %q, want store-lost", got)
	}
	// Claimed again under another fence with no seed for the plugin: the
	// idle instance is stale and dropped, the kept notice stays, and the
	// next instance starts afresh.
	if err := w.m.Seed(k, nil, 2); err != nil {
		t.Fatal(err)
	}
	l, err := w.m.Acquire(w.ctx, k, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	if r := l.Notice().Reset; r == nil || r.Reason != "store-lost" {
		t.Fatalf("the fresh instance's first lease: reset %+v, want store-lost", r)
	}
	l.Done(context.Canceled)
	arrived = time.Now() // after the notice was kept
	if got := w.reset(k, "counter", func(l *sessions.Lease) { l.KeepNoticeSince(arrived) }); got != "store-lost" {
		t.Errorf("after the cancelled first call: reset %q, want store-lost", got)
	}
	if got := w.reset(k, "counter", nil); got != "" {
		t.Errorf("the call after: reset %q, want none (the notice said a third time)", got)
	}
}

// storeLostWorld is a world whose client c1 is seeded (fence 1) with the
// counter's state lost by the store: its first lease says store-lost.
func storeLostWorld(t *testing.T) (*world, sessions.Key) {
	w := newWorld(t, sessions.Options{})
	k := sessions.Client("c1")
	if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "the store lost it", Reason: "store-lost"}}, 1); err != nil {
		w.finish()
		t.Fatal(err)
	}
	return w, k
}
