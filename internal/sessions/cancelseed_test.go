package sessions_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestCancelledThenSeededNoReset: an instance discarded because its call
// was cancelled, whose client is then seeded by a new claim with the
// state the store saved after its last call that succeeded, starts from
// that state with no reset notice, as one read back from the store does
// (TestInterruptedInstanceComesBackFromTheStore). The fault suite's
// sigstop-replica: a replica resumed after SIGSTOP cancelled a call and
// claimed the session again, and the "cancelled" reset was said though
// nothing was lost.
func TestCancelledThenSeededNoReset(t *testing.T) {
	ctx := context.Background()
	p := counterLoader(t)()
	t.Cleanup(func() { p.Close(ctx) })
	var saved *plugins.State
	m := sessions.New(&sessions.Options{StoredAfterCancel: true,
		Stored: func(context.Context, sessions.Key, *plugins.Plugin) (*plugins.State, string, uint64, bool) {
			return saved, "", 0, true
		}})
	t.Cleanup(func() { m.Close(ctx) })
	key := sessions.Client("a")
	count := func(done error) (string, sessions.Notice) {
		t.Helper()
		l, err := m.Acquire(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if done == nil {
			if saved, err = l.Instance().SaveState(ctx); err != nil {
				t.Fatal(err)
			}
		}
		n := l.Notice()
		l.Done(done)
		var c abi.TextContent
		if err := json.Unmarshal(res.Content[0], &c); err != nil {
			t.Fatal(err)
		}
		return c.Text, n
	}
	count(nil)
	count(nil)
	count(context.Canceled)
	if err := m.Seed(key, map[string]sessions.Seed{p.Name(): {State: saved}}, 7); err != nil {
		t.Fatal(err)
	}
	if got, n := count(nil); got != "3" || n.Reset != nil {
		t.Fatalf("after a cancelled call and a seed of the saved state: count %s (reset %+v); want 3, no reset", got, n.Reset)
	}
}
