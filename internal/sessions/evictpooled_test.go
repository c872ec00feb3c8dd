package sessions_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestPooledInstancesCountForTheirTenant: at an instance bound the
// instance freed is one of the tenant holding the most (SECURITY.md, "A
// fair share of everything shared"), idle pooled (stateless) instances
// counted for their pool's tenant, and freed first within that tenant.
// A review found reserve freeing any idle pooled instance first, whoever's
// pool held it, and the ranking counted no pooled instance.
//
// With room for five instances, bob keeps one warm instance of a stateless
// plugin in his pool, and alice holds four idle instances of a stateful
// one. Each new session of alice's must evict one of her own four, never
// bob's pooled one: before, bob paid a cold start on every call (his call
// evicted one of alice's, her next session freed his pooled one again),
// while alice, holding four of the five instances, kept them all.
func TestPooledInstancesCountForTheirTenant(t *testing.T) {
	type tenantKey struct{}
	w := newWorld(t, sessions.Options{MaxInstances: 5, PoolSize: 4, Tenant: func(ctx context.Context) string {
		s, _ := ctx.Value(tenantKey{}).(string)
		return s
	}})
	defer w.finish()
	var poolStarts int
	w.obs.onStart = func(plugin string) {
		if plugin == "pool" {
			poolStarts++ // Acquire calls onStart on the acquiring goroutine: this one
		}
	}
	counter, pool := w.plugin("counter"), w.plugin("pool")
	as := func(tenant string) context.Context { return context.WithValue(w.ctx, tenantKey{}, tenant) }
	bobCall := func() {
		t.Helper()
		l, err := w.m.Acquire(as("bob"), sessions.Client("bob"), pool)
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil) // back to bob's pool, idle
	}
	aliceSession := func(i int) {
		t.Helper()
		l, err := w.m.Acquire(as("alice"), sessions.Client(fmt.Sprint("alice-", i)), counter)
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	bobCall()
	for i := range 4 {
		aliceSession(i)
	}
	if st := w.m.Stats(); st.PerPlugin["counter"] != 4 || st.PerPlugin["pool"] != 1 {
		t.Fatalf("setup: %+v; want alice's 4 instances and bob's 1 pooled", st.PerPlugin)
	}
	// Alice's fifth session: she holds 4 of 5, bob 1.
	aliceSession(4)
	if st := w.m.Stats(); st.PerPlugin["pool"] != 1 {
		t.Errorf("alice's fifth session (she held 4 of 5 instances) freed bob's only instance, his pooled one: %+v; want one of alice's evicted", st.PerPlugin)
	}
	// And so on: every call of bob's is a cold start while alice churns.
	const rounds = 10
	before := poolStarts
	for i := range rounds {
		bobCall()
		aliceSession(5 + i)
	}
	if cold := poolStarts - before; cold > 1 {
		t.Errorf("bob's %d calls, each after a new session of alice's, started %d instances of his stateless plugin (cold starts); want at most 1: alice, holding the most, should lose her own", rounds, cold)
	}
}

// TestTenantsPooledInstanceGoesFirst: within the tenant that loses an
// instance at a bound, an idle pooled one goes before a session's state:
// alice's new session frees her warm stateless instance, not her other
// session's instance.
func TestTenantsPooledInstanceGoesFirst(t *testing.T) {
	w := newWorld(t, sessions.Options{MaxInstances: 2})
	defer w.finish()
	counter, pool := w.plugin("counter"), w.plugin("pool")
	for _, use := range []struct {
		key sessions.Key
		p   *plugins.Plugin
	}{{sessions.Client("alice-1"), counter}, {sessions.Client("alice-1"), pool}, {sessions.Client("alice-2"), counter}} {
		l, err := w.m.Acquire(w.ctx, use.key, use.p)
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	if !w.m.Holds(sessions.Client("alice-1"), "counter") {
		t.Errorf("alice's second session evicted her first's instance: %+v; want her idle pooled instance freed first", w.m.Stats().PerPlugin)
	}
}
