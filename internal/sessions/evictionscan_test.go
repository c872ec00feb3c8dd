package sessions_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestEvictionCostIndependentOfTenants: at an instance bound an eviction
// costs one pass over the live instances under the manager's lock,
// however many tenants hold them. A review found evictIdleLocked ranking
// the tenants and then, for each in turn, scanning the whole LRU list for
// an idle instance of that tenant: when the tenants ranked first had no
// idle instance (their instances busy: running, queued behind a token, or
// waiting for a person), an eviction cost instances × tenants, and every
// Acquire and Done of every tenant waited for it.
//
// Same server (room for 1001 instances), same 1000 busy instances, the
// victim's one idle instance evicted for each of its 50 new sessions. The
// only difference is whether the 1000 busy instances belong to 1 tenant
// (baseline) or to 500 tenants holding 2 each (which any 500 subjects,
// each far within its call share, can hold). Measured before the fix: 0.15
// to 0.4 ms a session start against 3 to 7 ms, growing with both numbers
// (10 000 instances among 2 500 tenants: 50 times that, under the lock,
// per session start); after, 0.07 to 0.15 ms against 0.09 to 0.14 ms.
func TestEvictionCostIndependentOfTenants(t *testing.T) {
	const n, rounds = 1000, 500
	measure := func(tenants int) time.Duration {
		w := newWorld(t, sessions.Options{MaxInstances: n + 1, Tenant: tenantOf})
		defer w.finish()
		counter := w.plugin("counter")
		held := make([]*sessions.Lease, 0, n)
		defer func() {
			for _, l := range held {
				l.Done(nil)
			}
		}()
		for i := range n {
			l, err := w.m.Acquire(w.as(fmt.Sprint("busy-", i%tenants)), sessions.Client(fmt.Sprint("c", i)), counter)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l) // busy: its slot is held
		}
		ctx := w.as("victim")
		return timePer(t, rounds, func(i int) error {
			l, err := w.m.Acquire(ctx, sessions.Client(fmt.Sprint("victim-", i)), counter)
			if err == nil {
				l.Done(nil)
			}
			return err
		})
	}
	one, many := bestOfTwo(measure, 1, 500)
	t.Logf("a victim's session start at the bound: %v with 1000 busy instances of 1 tenant, %v with the same of 500 tenants", one, many)
	if many > 5*one {
		t.Errorf("a session start at the instance bound took %.1f times as long when the busy instances belong to 500 tenants (%v) as to one (%v): eviction scans every instance once per tenant, under the manager's lock; want about the same", float64(many)/float64(one), many, one)
	}
}

// bestOfTwo measures a baseline and a load twice each, alternating, and
// returns the best of each: against a loaded machine, the ratio of the
// best runs is the steadiest.
func bestOfTwo(measure func(n int) time.Duration, base, load int) (time.Duration, time.Duration) {
	b, l := measure(base), measure(load)
	return min(b, measure(base)), min(l, measure(load))
}

// timePer runs op n times, in timeBatches batches, and returns the time
// each took in the fastest batch. On a loaded machine a batch the
// scheduler or the collector interrupted is slow, not the op: averaged
// over all n, one interruption of a run a millisecond or two long made it
// 5 and 24 times its baseline (this test and
// TestHandleOpenCostIndependentOfClients each failed once in 20 runs of
// the package on a loaded 2-core machine). An op that costs more each
// time is slower in every batch, the fastest too. op's error fails the
// test.
func timePer(t *testing.T, n int, op func(i int) error) time.Duration {
	t.Helper()
	const timeBatches = 20
	size := max(1, n/timeBatches)
	best := time.Duration(math.MaxInt64)
	for from := 0; from < n; from += size {
		to := min(n, from+size)
		start := time.Now()
		for i := from; i < to; i++ {
			if err := op(i); err != nil {
				t.Fatal(err)
			}
		}
		best = min(best, time.Since(start)/time.Duration(to-from))
	}
	return best
}
