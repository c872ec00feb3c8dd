package sessions_test

import (
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
	w := newWorld(t, sessions.Options{})
	defer w.finish()
	k := sessions.Client("c1")
	if err := w.m.Seed(k, map[string]sessions.Seed{"counter": {Lost: "the store lost it", Reason: "store-lost"}}, 1); err != nil {
		t.Fatal(err)
	}
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
