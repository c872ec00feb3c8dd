package sessions_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestWarmLeaseTakesLockTwice: a lease on the warm instance a client
// already has takes the manager's process-wide lock once as it is granted
// and once as it is done, for a session's, a header client's and a
// handle's key alike, whether its guest succeeded, returned an error of
// its own or its notice is kept, and with a bound on the calls running
// at once, its fence asked; so does a pooled instance's lease (it took it seven times: two in Acquire, five
// in Done; eight with the bound; one more each time Fence was asked). Under many sessions that lock is the host's most
// contended (issue 27, item 2). The instance goes on: each call counts
// on from the last.
func TestWarmLeaseTakesLockTwice(t *testing.T) {
	for _, opts := range []sessions.Options{{IdleTimeout: time.Hour}, {IdleTimeout: time.Hour, MaxConcurrentCalls: 4}} {
		t.Run(fmt.Sprintf("MaxConcurrentCalls=%d", opts.MaxConcurrentCalls), func(t *testing.T) {
			warmLeaseTakesLockTwice(t, opts)
		})
	}
}

func warmLeaseTakesLockTwice(t *testing.T, opts sessions.Options) {
	w := newWorld(t, opts)
	handle := sessions.Handle("h", "h")
	if err := w.m.Open(handle); err != nil {
		t.Fatal(err)
	}
	call := func(key sessions.Key, p *plugins.Plugin, i int) (count int, holds uint64) {
		t.Helper()
		before := w.m.LockTaken()
		l, err := w.m.Acquire(w.ctx, key, p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
		if err != nil || res.IsError {
			t.Fatal(err, res)
		}
		var c abi.TextContent
		if err := json.Unmarshal(res.Content[0], &c); err != nil {
			t.Fatal(err)
		}
		if count, err = strconv.Atoi(c.Text); err != nil {
			t.Fatal(err)
		}
		if f := l.Fence(); f != 0 { // a durable call asks it up to three times
			t.Fatalf("fence %d; want 0", f)
		}
		var done error
		switch i % 3 {
		case 1:
			l.KeepNotice()
		case 2:
			done = errors.New("the guest's own error")
		}
		l.Done(done)
		return count, w.m.LockTaken() - before - 1 // less LockTaken's own
	}
	p := w.plugin("counter")
	for _, key := range []sessions.Key{sessions.Conn(t, "conn", "conn"), sessions.Client("header"), handle} {
		last, _ := call(key, p, 0) // starts the instance
		for i := 1; i <= 12; i++ {
			n, holds := call(key, p, i)
			if n != last+1 {
				t.Fatalf("%s: call %d counted %d after %d: the instance did not go on", key, i, n, last)
			}
			last = n
			if holds != 2 {
				t.Errorf("%s: call %d took the manager's lock %d times; want 2", key, i, holds)
			}
		}
	}
	// A stateless plugin's pooled instance, back in its pool after each
	// call (four holds before: three in Done).
	pool := w.plugin("pool")
	call(sessions.Conn(t, "conn", "conn"), pool, 0) // starts the instance
	for i := 1; i <= 12; i++ {
		if _, holds := call(sessions.Conn(t, "conn", "conn"), pool, i); holds != 2 {
			t.Errorf("pooled: call %d took the manager's lock %d times; want 2", i, holds)
		}
	}
	if s := w.m.Stats(); s.Live != 4 {
		t.Errorf("%d live instances; want 4 (3 clients', 1 pooled)", s.Live)
	}
}
