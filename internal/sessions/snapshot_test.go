package sessions_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestRetireKeepsHostSnapshot: a version of the same code (a configuration
// change) takes over each client's instance with its whole state, saved by
// the host, for a plugin that exports no handoff pair of its own.
func TestRetireKeepsHostSnapshot(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	wasm := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	load := func() *plugins.Plugin {
		p, err := plugins.Load(ctx, rt, "counter.wasm", wasm, plugins.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	old, next := load(), load()
	t.Cleanup(func() { next.Close(ctx) })
	if old.HandsOffState() || !old.CarriesStateTo(next) {
		t.Fatalf("counter: HandsOffState %v, CarriesStateTo %v; want the host to carry its state", old.HandsOffState(), old.CarriesStateTo(next))
	}
	m := sessions.New(&sessions.Options{})
	t.Cleanup(func() { m.Close(ctx) })
	key := sessions.Client("a")
	count := func(p *plugins.Plugin) (string, sessions.Notice) {
		t.Helper()
		l, err := m.Acquire(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Done(nil)
		tool := p.Tools()[0]
		res, err := l.Instance().CallTool(l.Context(), plugins.Call{Tool: tool, Arguments: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		var c abi.TextContent
		if err := json.Unmarshal(res.Content[0], &c); err != nil {
			t.Fatal(err)
		}
		return c.Text, l.Notice()
	}
	for range 3 {
		count(old)
	}
	m.Retire(old, next)
	got, notice := count(next)
	if got != "4" || notice.Upgraded == nil {
		t.Errorf("after the retirement: count %q, notice %+v; want 4, upgraded", got, notice)
	}
}
