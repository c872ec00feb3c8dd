package sessions

import (
	"context"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A pool with no idle instance is dropped (pool.go), so that pools come
// and go with their tenants, and so is one Retire empties (a review found
// them left in m.pools: a tenant that did not come back kept an empty
// pool for ever, one more at each reload).
func TestRetireDropsEmptiedPools(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	wasm := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	load := func() *plugins.Plugin {
		p, err := plugins.Load(ctx, rt, "pool.wasm", wasm, plugins.Options{Stateless: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(ctx) })
		return p
	}
	type tk struct{}
	m := New(&Options{Tenant: func(ctx context.Context) string { s, _ := ctx.Value(tk{}).(string); return s }})
	t.Cleanup(func() { m.Close(ctx) })
	old := load()
	for _, tenant := range []string{"a", "b", "c"} {
		l, err := m.Acquire(context.WithValue(ctx, tk{}, tenant), Client(tenant), old)
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	m.Retire(old, load())
	m.mu.Lock()
	n := len(m.pools)
	m.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d empty pools left in m.pools after the retirement emptied them; want 0 (dropped when empty)", n)
	}
}
