package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// A plugin relisted (Reloader.Relist: a Plugin with the same code
// and new lists, served in place of p) and then replaced by a new version
// is retired as the relisted Plugin only. A lease on p itself (a call
// whose handler captured p's tool before the relist, queued behind its
// session's call) is not refused with ErrRetired: it runs the retired
// code after the swap, moving the session's instance back from the new
// version to the old, whose code the retirement then closes.
func TestRelistedThenReplacedRefusesOldPlugin(t *testing.T) {
	ctx := context.Background()
	load := counterLoader(t)
	p, v2 := load(), load()
	t.Cleanup(func() { v2.Close(ctx) })
	m := sessions.New(&sessions.Options{})
	t.Cleanup(func() { m.Close(ctx) })
	key := sessions.Client("a")
	count := func(q *plugins.Plugin) (string, sessions.Notice) {
		t.Helper()
		l, err := m.Acquire(ctx, key, q)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Done(nil)
		res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: q.Tools()[0], Arguments: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		var c abi.TextContent
		json.Unmarshal(res.Content[0], &c)
		return c.Text, l.Notice()
	}
	count(p)
	count(p)
	l, err := m.Acquire(ctx, key, p)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := p.Relist(ctx, l.Instance()) // what Reloader.Relist serves instead of p
	l.Done(nil)
	if err != nil {
		t.Fatal(err)
	}
	// The swap replacing the relisted plugin: a lease on p is refused from
	// then on, whether the retirement has closed the code yet or not.
	m.Retire(fresh, v2)
	l, err = m.Acquire(ctx, key, p)
	if !errors.Is(err, sessions.ErrRetired) {
		if l != nil {
			t.Errorf("lease on the pre-relist Plugin after its code was retired: err %v, instance code closed: %v (p.Closed() = %v)", err, l.Instance().Plugin().SameCode(fresh) && fresh.Closed(), p.Closed())
			_, cerr := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
			t.Logf("call on it: %v", cerr)
			l.Done(nil)
		}
		got, n := count(v2)
		t.Fatalf("Acquire(p) after Retire(relisted p, v2): err = %v, want ErrRetired; the session's next count on v2: %q, reset %+v (want 3, state kept)", err, got, n.Reset)
	}
}
