package sessions_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// counterLoader returns a func that loads the counter example plugin,
// each time as a new version, in a runtime closed when t ends.
func counterLoader(t *testing.T) func() *plugins.Plugin {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	wasm := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	return func() *plugins.Plugin {
		p, err := plugins.Load(ctx, rt, "counter.wasm", wasm, plugins.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestRetireKeepsHostSnapshot: a version of the same code (a configuration
// change) takes over each client's instance with its whole state, saved by
// the host, for a plugin that exports no handoff pair of its own.
func TestRetireKeepsHostSnapshot(t *testing.T) {
	ctx := context.Background()
	load := counterLoader(t)
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
		res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: tool, Arguments: json.RawMessage(`{}`)})
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

// TestRetireOverlapping: a retirement that moves a client's instance after
// the version it moves it to was retired in turn (the plugin's file
// replaced again meanwhile) moves it on to the newest version, state and
// all, and the version between is closed only once that retirement is
// done. It used to hand the state to the version between, which its own
// retirement had closed, having passed the slot while it still held the
// oldest version's instance: a failed hand-off, the client told its state
// was reset (and, with the close under the restore, a panic in wazero:
// TestImageClosedUnderInstantiate in sandbox).
func TestRetireOverlapping(t *testing.T) {
	ctx := context.Background()
	load := counterLoader(t)
	v1, v2, v3 := load(), load(), load()
	t.Cleanup(func() { v3.Close(ctx) })
	m := sessions.New(&sessions.Options{})
	t.Cleanup(func() { m.Close(ctx) })
	a, b := sessions.Client("a"), sessions.Client("b")
	acquire := func(k sessions.Key, p *plugins.Plugin) *sessions.Lease {
		t.Helper()
		l, err := m.Acquire(ctx, k, p)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	count := func(p *plugins.Plugin) (string, sessions.Notice) {
		t.Helper()
		l := acquire(a, p)
		defer l.Done(nil)
		res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
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
		count(v1)
	}
	waitFor := func(cond func() bool, d time.Duration) bool {
		for end := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				return false
			}
		}
		return true
	}
	la, lb := acquire(a, v1), acquire(b, v1)
	m.Retire(v1, v2) // a's slot is busy: moved once no lease runs v1 (lb)
	la.Done(nil)     // a's slot idle, its instance still v1's
	m.Retire(v2, v3) // passes a's slot, whose instance is not v2's
	// v2 stays open while v1's retirement may move an instance to it;
	// before, v2's retirement closed it at once.
	waitFor(v2.Closed, 200*time.Millisecond)
	lb.Done(nil) // v1's retirement moves a's instance now
	if !waitFor(v1.Closed, 10*time.Second) {
		t.Fatal("v1's retirement did not end")
	}
	got, notice := count(v3)
	if got != "4" || notice.Upgraded == nil || notice.Reset != nil {
		t.Errorf("after two overlapping retirements: count %q, notice %+v, reset %+v; want 4, upgraded", got, notice, notice.Reset)
	}
	if !waitFor(v2.Closed, 10*time.Second) {
		t.Error("v2's retirement did not close it once v1's was done")
	}
}

// An instance discarded because its call was cancelled (a client long
// gone) comes back, with Options.StoredAfterCancel, from the state the
// store saved after its last call that succeeded (Options.Stored), with
// no reset: the failed call's effect is not in it, as it should not be.
// One that ran out of time starts afresh, told so: the same state may run
// out of time again, and a session restored to it each time would fail
// for good. Before, a cancelled instance started afresh with a
// "cancelled" reset, and the session's whole state was gone though the
// store held it (issue #25, item 7). So does one whose client a new claim
// seeds with that state.
func TestInterruptedInstanceComesBackFromTheStore(t *testing.T) {
	ctx := context.Background()
	p := counterLoader(t)()
	t.Cleanup(func() { p.Close(ctx) })
	var saved *plugins.State // the store's copy, as of the last call saved
	m := sessions.New(&sessions.Options{StoredAfterCancel: true,
		Stored: func(context.Context, sessions.Key, *plugins.Plugin) (*plugins.State, string, uint64, bool) {
			return saved, "", 0, true
		}})
	t.Cleanup(func() { m.Close(ctx) })
	key := sessions.Client("a")
	// count calls the counter; done ends its lease with the error given.
	count := func(done error) (string, sessions.Notice) {
		t.Helper()
		return countOn(t, m, key, p, done, func(l *sessions.Lease) {
			if done == nil {
				var err error
				if saved, err = l.Instance().SaveState(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	count(nil)
	count(nil)
	count(context.Canceled) // its effect is lost with the instance
	if got, n := count(nil); got != "3" || n.Reset != nil {
		t.Fatalf("after a cancelled call: count %s (reset %+v); want 3, no reset", got, n.Reset)
	}
	count(context.DeadlineExceeded)
	if got, n := count(nil); got != "1" || n.Reset == nil || n.Reset.Reason != "timeout" {
		t.Fatalf("after a call that timed out: count %s (reset %+v); want 1, reset timeout", got, n.Reset)
	}
	// A new claim that seeds the client with the state saved after its
	// last call that succeeded, as after the cancel a replica resumed
	// from SIGSTOP claims the session again: no reset either (the fault
	// suite's sigstop-replica said "cancelled" though nothing was lost).
	count(nil)
	count(context.Canceled)
	if err := m.Seed(key, map[string]sessions.Seed{p.Name(): {State: saved}}, 7); err != nil {
		t.Fatal(err)
	}
	if got, n := count(nil); got != "3" || n.Reset != nil {
		t.Fatalf("after a cancelled call and a seed of the saved state: count %s (reset %+v); want 3, no reset", got, n.Reset)
	}
}

// countOn calls the counter p on key's instance in m, runs saw (if not
// nil) on the lease, and ends it with done: the count and the lease's
// notice.
func countOn(t *testing.T, m *sessions.Manager, key sessions.Key, p *plugins.Plugin, done error, saw func(*sessions.Lease)) (string, sessions.Notice) {
	t.Helper()
	l, err := m.Acquire(context.Background(), key, p)
	if err != nil {
		t.Fatal(err)
	}
	res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if saw != nil {
		saw(l)
	}
	n := l.Notice()
	l.Done(done)
	var c abi.TextContent
	if err := json.Unmarshal(res.Content[0], &c); err != nil {
		t.Fatal(err)
	}
	return c.Text, n
}

// An instance started afresh whose first call is cancelled (a client
// gone, a proxy killed mid-call) holds nothing a new instance would not:
// its retry is served by a new one, with no reset to tell of, whatever
// the store says (here it has nothing for the plugin, as for a session's
// first call of a plugin). Before, the retry carried stateReset
// "cancelled" for a plugin that had no state to lose (the fault suite's
// proxy-restart behind nginx: unwarranted-reset). One that completed a
// call first, its state in memory alone, is still said reset.
func TestCancelledFirstCallResetsNothing(t *testing.T) {
	ctx := context.Background()
	p := counterLoader(t)()
	t.Cleanup(func() { p.Close(ctx) })
	for _, afterCancel := range []bool{true, false} {
		m := sessions.New(&sessions.Options{StoredAfterCancel: afterCancel,
			Stored: func(context.Context, sessions.Key, *plugins.Plugin) (*plugins.State, string, uint64, bool) {
				return nil, "", 0, true // nothing saved for the plugin
			}})
		t.Cleanup(func() { m.Close(ctx) })
		key := sessions.Client("a")
		count := func(done error) (string, sessions.Notice) {
			t.Helper()
			return countOn(t, m, key, p, done, nil)
		}
		count(context.Canceled) // the plugin's first call, cut
		if got, n := count(nil); got != "1" || n.Reset != nil {
			t.Errorf("StoredAfterCancel %v: the retry of a first call cancelled: count %s (reset %+v); want 1, no reset", afterCancel, got, n.Reset)
		}
		count(context.Canceled) // its state (1) in memory alone: lost
		if got, n := count(nil); got != "1" || n.Reset == nil || n.Reset.Reason != "cancelled" {
			t.Errorf("StoredAfterCancel %v: after a call and a cancelled one, nothing saved: count %s (reset %+v); want 1, reset cancelled", afterCancel, got, n.Reset)
		}
	}
}

// A notice the cancelled first call's lease took (its slot's earlier
// instance evicted, its state not saved) went unheard with the call: the
// retry says it, as it said "cancelled" before.
func TestCancelledFirstCallKeepsItsNotice(t *testing.T) {
	ctx := context.Background()
	p := counterLoader(t)()
	t.Cleanup(func() { p.Close(ctx) })
	m := sessions.New(&sessions.Options{MaxInstances: 1})
	t.Cleanup(func() { m.Close(ctx) })
	call := func(key sessions.Key, done error) sessions.Notice {
		t.Helper()
		l, err := m.Acquire(ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		n := l.Notice()
		l.Done(done)
		return n
	}
	a, b := sessions.Client("a"), sessions.Client("b")
	call(a, nil)
	call(b, nil) // a's instance evicted for room
	call(a, context.Canceled)
	if n := call(a, nil); n.Reset == nil || n.Reset.Reason != sessions.ReasonEvicted {
		t.Fatalf("after the eviction and a cancelled first call of the new instance: reset %+v; want evicted", n.Reset)
	}
}
