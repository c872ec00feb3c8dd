package durable

import (
	"testing"
	"time"
)

// TestAwayExplains holds beats.awayExplains to its rule: a claim verified
// at v and not since may be written back over a record the store lost
// only when this process ran all along (heartbeat rounds every 2 s, no gap
// past pauseGap) and the store stopped answering its heartbeat within
// memoryGrace of v, until it came back after v. A stop of the process, a
// store that answered meanwhile (the session went on elsewhere, nobody
// asked this replica), or no heartbeat loop, and it may not.
func TestAwayExplains(t *testing.T) {
	s := time.Second
	// run plays heartbeat rounds every 2 s over [from, to], the store
	// answering but in [down, up).
	type span struct{ from, to, down, up time.Duration }
	run := func(spans ...span) *beats {
		b := &beats{}
		for _, sp := range spans {
			for at := sp.from; at <= sp.to; at += 2 * s {
				b.beat(at)
				b.answered(at, at < sp.down || at >= sp.up)
			}
		}
		return b
	}
	const never = time.Hour
	for _, c := range []struct {
		what   string
		b      *beats
		v, now time.Duration
		want   bool
	}{
		{"an outage from just after v until now", run(span{10 * s, 40 * s, 21 * s, never}), 20 * s, 41 * s, true},
		{"an outage from just after v, over before now", run(span{10 * s, 40 * s, 21 * s, 33 * s}), 20 * s, 41 * s, true},
		{"the store answered all along (nobody asked here)", run(span{10 * s, 40 * s, never, never}), 20 * s, 41 * s, false},
		{"the store answered long after v, then an outage", run(span{10 * s, 40 * s, 31 * s, never}), 20 * s, 41 * s, false},
		{"an outage over before v", run(span{10 * s, 40 * s, 12 * s, 16 * s}), 20 * s, 41 * s, false},
		{"no heartbeat loop", run(), 20 * s, 41 * s, false},
		{"stopped since, not a round since", run(span{10 * s, 22 * s, 21 * s, never}), 20 * s, 41 * s, false},
		{"stopped during the outage", run(span{10 * s, 24 * s, 21 * s, never}, span{34 * s, 40 * s, 0, never}), 20 * s, 41 * s, false},
		{"stopped before v only", run(span{1 * s, 5 * s, never, never}, span{15 * s, 40 * s, 21 * s, never}), 20 * s, 41 * s, true},
	} {
		if got := c.b.awayExplains(c.v, c.now); got != c.want {
			t.Errorf("%s: awayExplains = %v, want %v", c.what, got, c.want)
		}
	}
}

// TestStoppedSince holds beats.stoppedSince to its rule: a request that
// arrived at since lived through a stop of the process when the heartbeat
// loop has a gap over pauseGap that ended after since, or has not run for
// over pauseGap now (the process is coming out of a stop before the loop's
// next round). A process that ran all along, a stop before the request, or
// no heartbeat loop at all, and it did not.
func TestStoppedSince(t *testing.T) {
	s := time.Second
	beat := func(at ...time.Duration) *beats {
		b := &beats{}
		for _, a := range at {
			b.beat(a)
		}
		return b
	}
	for _, c := range []struct {
		what       string
		b          *beats
		since, now time.Duration
		want       bool
	}{
		{"ran all along", beat(10*s, 12*s, 14*s, 16*s), 11 * s, 17 * s, false},
		{"stopped after the request arrived, loop ran since", beat(10*s, 12*s, 22*s, 24*s), 11 * s, 25 * s, true},
		{"coming out of a stop, loop not run yet", beat(10*s, 12*s), 11 * s, 21 * s, true},
		// Read after the loop's first round past the stop, it may have
		// been sent before the stop: the fault suite's
		// sigstop-redis-empty found such a request's reset notice, kept
		// by no one, and its state recorded without it.
		{"read just after a stop", beat(10*s, 12*s, 22*s, 24*s), 23 * s, 25 * s, true},
		{"a stop long before the request arrived", beat(10*s, 12*s, 22*s, 24*s, 26*s, 28*s, 30*s), 29 * s, 31 * s, false},
		{"no heartbeat loop", beat(), 11 * s, 60 * s, false},
	} {
		if got := c.b.stoppedSince(c.since, c.now); got != c.want {
			t.Errorf("%s: stoppedSince(%v, %v) = %v, want %v", c.what, c.since, c.now, got, c.want)
		}
	}
}
