package durable

import (
	"testing"
	"time"
)

// TestRanSince holds beats.ranSince to its rule: a claim verified at v,
// in a process whose heartbeat loop ran all along (rounds every 2 s, the
// store answering or not), went unverified for want of the store; a gap
// between rounds past pauseGap, or none lately, or no loop at all, means
// the process may have been stopped, and newestHere then keeps its state
// from being written back over a lost record.
func TestRanSince(t *testing.T) {
	s := time.Second
	run := func(rounds ...time.Duration) *beats {
		b := &beats{}
		for _, r := range rounds {
			b.beat(r)
		}
		return b
	}
	every2s := func(from, to time.Duration) []time.Duration {
		var r []time.Duration
		for at := from; at <= to; at += 2 * s {
			r = append(r, at)
		}
		return r
	}
	for _, c := range []struct {
		what   string
		b      *beats
		v, now time.Duration
		want   bool
	}{
		{"ran all along (an outage of the store)", run(every2s(10*s, 40*s)...), 20 * s, 41 * s, true},
		{"no heartbeat loop", run(), 20 * s, 41 * s, false},
		{"stopped since, not a round since", run(every2s(10*s, 22*s)...), 20 * s, 41 * s, false},
		{"stopped since, rounds after", run(append(every2s(10*s, 22*s), every2s(32*s, 40*s)...)...), 20 * s, 41 * s, false},
		{"stopped before the claim's verification only", run(append(every2s(1*s, 5*s), every2s(15*s, 40*s)...)...), 20 * s, 41 * s, true},
		{"the loop began long after the verification", run(every2s(30*s, 40*s)...), 20 * s, 41 * s, false},
	} {
		if got := c.b.ranSince(c.v, c.now); got != c.want {
			t.Errorf("%s: ranSince = %v, want %v", c.what, got, c.want)
		}
	}
}
