package sessions_test

import (
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
	w := newWorld(t, sessions.Options{MaxInstances: 5, PoolSize: 4, Tenant: tenantOf})
	defer w.finish()
	var poolStarts int
	w.obs.onStart = func(plugin string) {
		if plugin == "pool" {
			poolStarts++ // Acquire calls onStart on the acquiring goroutine: this one
		}
	}
	counter, pool := w.plugin("counter"), w.plugin("pool")
	as := w.as
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

// TestBusyPooledInstancesCountForTheirTenant: a tenant's stateless
// instances count for it in the ranking while its calls run on them, not
// only while they sit idle in its pool. With room for five instances,
// alice runs two calls of a stateless plugin (two pooled instances, busy)
// and holds one idle session instance; bob holds two idle session
// instances. Alice holds three of the five, so carol's new session must
// evict alice's idle one. A review found the ranking counting only idle
// pooled instances: alice counted 1 to bob's 2, and bob lost one, however
// many stateless calls alice kept running.
func TestBusyPooledInstancesCountForTheirTenant(t *testing.T) {
	w := newWorld(t, sessions.Options{MaxInstances: 5, PoolSize: 4, Tenant: tenantOf})
	defer w.finish()
	w.version("bobs", false)
	w.version("carols", false)
	as := w.as
	session := func(tenant, client, plugin string) {
		t.Helper()
		l, err := w.m.Acquire(as(tenant), sessions.Client(client), w.plugin(plugin))
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	var busy []*sessions.Lease
	for range 2 {
		l, err := w.m.Acquire(as("alice"), sessions.Client("alice-stateless"), w.plugin("pool"))
		if err != nil {
			t.Fatal(err)
		}
		busy = append(busy, l)
	}
	defer func() {
		for _, l := range busy {
			l.Done(nil)
		}
	}()
	session("alice", "alice-0", "counter")
	session("bob", "bob-0", "bobs")
	session("bob", "bob-1", "bobs")
	if st := w.m.Stats(); st.Live != 5 || st.PerPlugin["counter"] != 1 || st.PerPlugin["bobs"] != 2 || st.PerPlugin["pool"] != 2 {
		t.Fatalf("setup: %d live, %+v; want alice's 2 busy pooled and 1 idle, bob's 2", st.Live, st.PerPlugin)
	}
	session("carol", "carol-0", "carols")
	if st := w.m.Stats(); st.PerPlugin["bobs"] != 2 || st.PerPlugin["counter"] != 0 {
		t.Errorf("carol's session at the bound evicted %+v; want alice's idle instance (she holds 3 of 5, two busy stateless), not bob's (2 of 5)", st.PerPlugin)
	}
}
