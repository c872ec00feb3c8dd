package durable

import (
	"cmp"
	"context"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestRedisFaultsClassified holds the classification (refusedConn,
// silent) to what the Redis store really returns, through bounded, as
// ServeElsewhere's probe meets it: go-redis retries a command once after
// a network error (MaxRetries 1), dials up to five times before it gives
// up, and checks a pooled connection before it uses it, so what a fault
// leaves of the errors met is the last attempt's. A store that went down
// (its port refusing, its connections dropped or reset) or is restarting
// (LOADING) must be noted refused, so that no session is handed over
// until it answers again; one that is silent (frozen, blackholed) may
// hand over.
func TestRedisFaultsClassified(t *testing.T) {
	addr := proxytest.StartRedis(t)
	for _, c := range []struct {
		name    string
		fault   func(*proxytest.Relay)
		refused bool          // noted refused; else silent
		bound   time.Duration // bounded's, DefaultStoreTimeout if 0
	}{
		{"down", func(f *proxytest.Relay) { f.Stop(); f.CloseAll() }, true, 0},
		// go-redis dials five times, 100 ms apart, and then once more
		// (MaxRetries): a shorter bound (or a busy machine) ends the
		// exchange first, and its error is the deadline's.
		{"down, short bound", func(f *proxytest.Relay) { f.Stop(); f.CloseAll() }, true, 300 * time.Millisecond},
		{"frozen", func(f *proxytest.Relay) { f.SetMode(proxytest.RelaySilent) }, false, 0},
		{"reset mid-command", func(f *proxytest.Relay) { f.SetMode(proxytest.RelayReset) }, true, 0},
		{"loading", func(f *proxytest.Relay) { f.SetMode(proxytest.RelayLoading) }, true, 0},
		// Its connections closed (a Redis host shutting down), then
		// nothing answers (the host down): a drop this replica met.
		{"dropped, then silent", func(f *proxytest.Relay) { f.SetMode(proxytest.RelaySilent); f.CloseAll() }, true, 0},
	} {
		for _, detached := range []bool{false, true} {
			name := c.name
			if detached {
				name += ", detached"
			}
			t.Run(name, func(t *testing.T) {
				f := proxytest.StartRelay(t, addr)
				r, err := statestore.NewRedis("redis://" + f.Addr() + "/0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				d := &Keeper{}
				d.epochAt.Store(1)
				st := bounded{Store: r, d: cmp.Or(c.bound, DefaultStoreTimeout), refusedAt: &d.refusedAt}
				ctx := context.Background()
				if detached {
					ctx = statestore.Detach(ctx)
				}
				owner := statestore.Owner{Replica: "a", Boot: "b"}
				// A connection pooled, past bounded: only the client's own
				// bounds, not the case's (300 ms), for the first dial and
				// script load of a machine under load.
				if err := r.Heartbeat(ctx, owner, time.Minute); err != nil {
					t.Fatal(err)
				}
				c.fault(f)
				// An exchange the machine stalled past its bound before it
				// met the fault (a busy machine under -race: the bound is
				// 300 ms in one case) met nothing, and is rightly not noted:
				// a fault that must be noted is met again, a few times. A
				// fault never noted fails each.
				for try := 1; ; try++ {
					err = st.Heartbeat(ctx, owner, time.Minute)
					if err == nil {
						t.Fatal("answered")
					}
					if !c.refused || d.refusedLately() || try == 5 {
						break
					}
					t.Logf("try %d: %v: not noted refused; again", try, err)
				}
				if got := d.refusedLately(); got != c.refused {
					t.Errorf("%v: noted refused %v; want %v", err, got, c.refused)
				}
				if !c.refused && !silent(err) {
					t.Errorf("%v: not silent", err)
				}
				t.Logf("%v (%T)", err, err)
			})
		}
	}
}
