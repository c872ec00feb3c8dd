package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// The results kept for at-most-once calls stay within their bounds:
// maxOnce per plugin, maxResends of them resends, maxOnceBytes in all; a
// result too large is kept as a refusal to run again.
func TestOnceBounds(t *testing.T) {
	c := newClaim(sessions.Client("x"), "s.x")
	for i := range 20 {
		c.remember("p", &Once{Key: fmt.Sprint("k:", i), Result: []byte(`{}`)})
		c.remember("p", &Once{Key: fmt.Sprint("r:", i), Result: []byte(`{}`)})
	}
	got := c.done["p"]
	resends := 0
	for _, o := range got {
		if strings.HasPrefix(o.Key, "r:") {
			resends++
		}
	}
	if len(got) != maxOnce || resends != maxResends || got[len(got)-1].Key != "r:19" {
		t.Fatalf("kept %d results, %d resends, newest %q", len(got), resends, got[len(got)-1].Key)
	}
	c.remember("p", &Once{Key: "k:big", Result: []byte(`"` + strings.Repeat("x", maxOnceBytes) + `"`)})
	last := c.done["p"][len(c.done["p"])-1]
	if last.Key != "k:big" || len(last.Result) > maxOnceBytes || !strings.Contains(string(last.Result), "too large") {
		t.Fatalf("a result over the bound: %q %d bytes", last.Key, len(last.Result))
	}
}

// A call whose result fell out of the kept ones is still not run again:
// its key is remembered (within maxRan), and its replay is a refusal.
// The old code ran it again: a request that waited in a replica stopped
// by SIGSTOP, continued after its client's retry ran elsewhere and more
// than maxOnce calls followed, was applied twice (issue #25).
func TestOnceKeysOutlastResults(t *testing.T) {
	d := &Keeper{}
	c := newClaim(sessions.Client("x"), "s.x")
	for i := range maxRan + 50 {
		c.remember("p", &Once{Key: fmt.Sprint("k:", i), Result: []byte(`{"content":[]}`)})
	}
	if res := string(d.Replay(c, "k:60")); !strings.Contains(res, `"isError":true`) || !strings.Contains(res, "not run again") {
		t.Fatalf("replay of a key whose result is no longer kept: %s", res)
	}
	if res := string(d.Replay(c, fmt.Sprint("k:", maxRan+49))); res != `{"content":[]}` {
		t.Fatalf("replay of the last key: %s", res)
	}
	if res := d.Replay(c, "k:10"); res != nil {
		t.Fatalf("a key older than maxRan calls: %s; want nil (forgotten)", res)
	}
	if res := d.Replay(c, "k:never"); res != nil {
		t.Fatalf("a key never seen: %s", res)
	}
	if n := len(c.ran["p"]); n != maxRan*ranSize {
		t.Fatalf("ran holds %d bytes; want %d", n, maxRan*ranSize)
	}
}

// An exchange's failure opens the breaker only when the store had the
// exchange's bound to answer in, with this process running: not when the
// exchange began past its deadline or near it (the process was stopped
// or slow earlier in the call), nor when its deadline fired well after it
// was due (stopped or starved during the exchange).
func TestStalledExchangeKeepsBreakerClosed(t *testing.T) {
	const bound = time.Second
	now := time.Now()
	for _, tc := range []struct {
		name          string
		begun, dl     time.Time
		err           error
		stalled, trip bool
	}{
		{"timed out on time", now.Add(-bound), now, context.DeadlineExceeded, false, true},
		{"refused at once", now, now.Add(bound), errors.New("connection refused"), false, true},
		{"fired late (stopped during it)", now.Add(-9 * bound), now.Add(-8 * bound), context.DeadlineExceeded, true, false},
		{"began past its deadline (stopped before it)", now, now.Add(-7 * bound), context.DeadlineExceeded, true, false},
		// A checkpoint's exchanges share one second with its snapshot
		// and one another: on a machine out of CPU, what went before
		// took 735 ms, an exchange was given 265 ms, timed out (its
		// socket read; 7 of 8 pooled connections idle) and opened a
		// replica's breaker: 452 calls served from memory, notSaved
		// (the fault suite's sigstop-past-proxy, a replica never
		// stopped).
		{"given a quarter of its bound (the call's steps before took the rest)", now.Add(-265 * time.Millisecond), now, context.DeadlineExceeded, true, false},
		{"given most of its bound", now.Add(-900 * time.Millisecond), now, context.DeadlineExceeded, false, true},
		// Its deadline fired 430 ms late: this process did not run when
		// it was due, so the store's answer may have been there unread
		// (the same run: 121 more calls served from memory).
		{"fired 430 ms late (starved at its deadline)", now.Add(-bound - 430*time.Millisecond), now.Add(-430 * time.Millisecond), context.DeadlineExceeded, true, false},
		{"fired a little late", now.Add(-bound - 100*time.Millisecond), now.Add(-100 * time.Millisecond), context.DeadlineExceeded, false, true},
		{"fenced, late", now.Add(-9 * bound), now.Add(-8 * bound), statestore.ErrFenced, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithDeadline(context.Background(), tc.dl)
			defer cancel()
			err := bounded{d: bound}.ended(ctx, tc.begun, tc.err)
			var s *stalledError
			if got := errors.As(err, &s); got != tc.stalled || !errors.Is(err, tc.err) {
				t.Fatalf("ended: %v, stalled %v; want stalled %v, matching %v", err, got, tc.stalled, tc.err)
			}
			d := &Keeper{}
			d.observe(err)
			if got := d.open(); got != tc.trip {
				t.Fatalf("breaker open %v after %v; want %v", got, err, tc.trip)
			}
		})
	}
}

// WaitStore returns at once with the breaker closed, waits out an open
// one (it is closed when WaitStore returns), and gives up with its ctx.
func TestWaitStore(t *testing.T) {
	d := &Keeper{}
	if err := d.WaitStore(context.Background()); err != nil {
		t.Fatalf("closed breaker: %v", err)
	}
	d.observe(context.DeadlineExceeded)
	if !d.open() {
		t.Fatal("an unanswered exchange left the breaker closed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.WaitStore(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v", err)
	}
	if err := d.WaitStore(context.Background()); err != nil || d.open() {
		t.Fatalf("after WaitStore: %v, open %v", err, d.open())
	}
}

// The breaker's opening is logged once, with the error that opened it,
// however many exchanges fail while it opens; not for a stalled exchange
// (it opens nothing), and again when it opens anew after its window.
// Its notSaved results are many (hundreds a second), its cause one line:
// the fault suite reports it per replica.
func TestBreakerOpeningLoggedOnce(t *testing.T) {
	var out bytes.Buffer
	d := &Keeper{log: slog.New(slog.NewTextHandler(&out, nil))}
	opened := func() int { return strings.Count(out.String(), BreakerOpened) }
	d.observe(&stalledError{context.DeadlineExceeded})
	if n := opened(); n != 0 || d.open() {
		t.Fatalf("a stalled exchange: logged %d, open %v; want 0, false", n, d.open())
	}
	for range 3 {
		d.observe(context.DeadlineExceeded)
	}
	if n := opened(); n != 1 || !d.open() || !strings.Contains(out.String(), "context deadline exceeded") {
		t.Fatalf("3 unanswered exchanges: logged %d, open %v; want 1, true, with the error:\n%s", n, d.open(), out.String())
	}
	d.downUntil.Store(0) // its window over
	d.observe(context.DeadlineExceeded)
	if n := opened(); n != 2 {
		t.Fatalf("opened again after its window: logged %d in all; want 2", n)
	}
	(&Keeper{}).observe(context.DeadlineExceeded) // no logger: no panic
}
