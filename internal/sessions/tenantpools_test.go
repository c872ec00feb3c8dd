package sessions_test

import (
	"fmt"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// Without an instance bound (MaxInstances 0, the default of `wasmtools
// serve`), a stateless plugin's warm pools are each tenant's own, and
// PoolSize bounds their idle instances across all of them: 50 tenants'
// calls leave at most PoolSize. A review found each tenant's pool kept
// PoolSize of its own, so every tenant that once called the plugin kept
// an idle instance live for ever.
func TestTenantPoolsBoundedWithoutInstanceLimit(t *testing.T) {
	w := newWorld(t, sessions.Options{PoolSize: 2, Tenant: tenantOf})
	defer w.finish()
	pool := w.plugin("pool")
	const tenants = 50
	for i := range tenants {
		l, err := w.m.Acquire(w.as(fmt.Sprintf("tenant-%d", i)), sessions.Client(fmt.Sprint("c", i)), pool)
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	if live := w.m.Stats().Live; live > 2 {
		t.Fatalf("%d idle pooled instances of one stateless plugin live after %d tenants' calls, each done; want at most PoolSize (2), as with one pool", live, tenants)
	}
}
