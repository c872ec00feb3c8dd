//go:build unix

package statestore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// openRedis opens the Redis store at url, closed when the test ends.
func openRedis(t *testing.T, url string) *Redis {
	t.Helper()
	r, err := NewRedis(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// untilFar is a context cancelled once far is closed (an exchange over a
// link that answers nothing got as far as the test needs) or the test
// ends, its deadline 10 s for a test gone wrong: an exchange that a
// deadline ends may, on a loaded machine, end before it got that far, or
// after its retry went further (the connection's read deadline comes
// before the context's, and go-redis retries a read timed out).
func untilFar(t *testing.T, far <-chan struct{}) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	go func() {
		select {
		case <-far:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx
}

// TestIdleConnClosedNotDropped: a connection the server closes after it
// sat idle in the pool a long while (Redis's `timeout`, a balancer's or a
// NAT's idle timeout) is no sign of the store's process going down: an
// exchange that then fails for want of an answer (the link blackholed)
// is silent, not ErrDropped, so that the hand-over still happens. A
// store that goes down closes the connections in use too, which are
// counted (TestDropsCounted, internal/durable's
// TestRedisFaultsClassified).
func TestIdleConnClosedNotDropped(t *testing.T) {
	addr := proxytest.StartRedis(t)
	for _, c := range []struct {
		name    string
		idle    time.Duration // connection 0's, before the server closes it
		dropped bool
	}{
		{"closed idle a minute", time.Minute, false},
		// A close of one in use a moment ago is the store's process
		// going down (its host shutting down), and counts.
		{"closed idle a moment", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rl := proxytest.StartRelay(t, addr)
			r := openRedis(t, "redis://"+rl.Addr()+"/0")
			ctx := context.Background()
			// Two connections in the pool: NewRedis's (0), and another
			// (1), returned last, so that it is the one taken next.
			c0, c1 := r.c.Conn(), r.c.Conn()
			if err := c0.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c1.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			c0.Close()
			c1.Close()
			// Time on, connection 1 still in use (the heartbeat's), 0
			// idle all along; then the server closes 0.
			r.drops.ahead.Add(int64(c.idle))
			o := Owner{Replica: "a", Boot: "b"}
			if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
				t.Fatal(err)
			}
			rl.Conn(0).Close()
			rl.SetMode(proxytest.RelaySilent)
			// The first exchange sends on connection 1, which the link
			// swallows; the second finds 0 closed, and dials one (the
			// relay's third) that the link swallows too. Each ends
			// once it got that far (untilFar): under a deadline, the
			// first's retry could reach connection 0 (ErrDropped), or
			// the second fail before it did. The first's send, left
			// waiting for its answer, keeps connection 1 from the
			// second.
			for i, far := range []<-chan struct{}{rl.Swallowed(1), rl.Accepted(3)} {
				err := r.Heartbeat(untilFar(t, far), o, time.Minute)
				if err == nil {
					t.Fatalf("exchange %d, link blackholed: answered", i)
				}
				if want := c.dropped && i == 1; errors.Is(err, ErrDropped) != want {
					t.Errorf("exchange %d, link blackholed: %v; ErrDropped %v, want %v", i, err, !want, want)
				}
			}
		})
	}
}

// TestDropMarksLaterExchanges: an exchange that fails for want of an
// answer is marked ErrDropped when a connection was dropped since the
// store last answered, though another exchange met the drop before this
// one began and has not failed yet: the heartbeat found its connection
// closed (a Redis host shutting down) and waits on a dial the link
// swallows, while a probe of the hand-over dials into the same silence
// and ends first. Only the heartbeat's failure, later, would say the
// store went down.
func TestDropMarksLaterExchanges(t *testing.T) {
	rl := proxytest.StartRelay(t, proxytest.StartRedis(t))
	r := openRedis(t, "redis://"+rl.Addr()+"/0")
	<-rl.Accepted(1) // NewRedis's connection, in the pool
	ctx := context.Background()
	o := Owner{Replica: "a", Boot: "b"}
	if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
		t.Fatal(err)
	}
	rl.SetMode(proxytest.RelaySilent)
	rl.Conn(0).Close()
	first := make(chan error, 1)
	go func() {
		bctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		first <- r.Heartbeat(bctx, o, time.Minute)
	}()
	<-rl.Accepted(2) // its dial, after it found connection 0 closed
	bctx, cancel := context.WithTimeout(ctx, time.Second)
	err := r.Heartbeat(bctx, o, time.Minute)
	cancel()
	if !errors.Is(err, ErrDropped) {
		t.Errorf("the later exchange: %v; want ErrDropped", err)
	}
	if err := <-first; !errors.Is(err, ErrDropped) {
		t.Errorf("the exchange that met the drop: %v; want ErrDropped", err)
	}
}

// TestLoadingOnAnEarlierAttemptDropped: an exchange whose first attempt
// Redis answered LOADING (restarting, loading its data) and whose retry
// then met the deadline is marked ErrDropped: go-redis returns its last
// attempt's error alone, the deadline, and the hand-over read a store
// that was restarting (and may come back empty) as silent. The retry's
// backoff is set past the deadline here, as a Redis busy loading its
// data answers the retry late.
func TestLoadingOnAnEarlierAttemptDropped(t *testing.T) {
	addr := proxytest.StartRedis(t)
	for _, detached := range []bool{false, true} {
		t.Run(fmt.Sprintf("detached %v", detached), func(t *testing.T) {
			rl := proxytest.StartRelay(t, addr)
			r := openRedis(t, "redis://"+rl.Addr()+"/0")
			// Read at each retry, by the exchanges begun after this.
			opt := r.c.Options()
			opt.MinRetryBackoff, opt.MaxRetryBackoff = 3*time.Second, 3*time.Second
			ctx := context.Background()
			if detached {
				ctx = Detach(ctx)
			}
			o := Owner{Replica: "a", Boot: "b"}
			if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
				t.Fatal(err)
			}
			rl.SetMode(proxytest.RelayLoading)
			bctx, cancel := WithTimeout(ctx, time.Second)
			err := r.Heartbeat(bctx, o, time.Minute)
			cancel()
			if !errors.Is(err, ErrDropped) {
				t.Errorf("LOADING, then the retry past the deadline: %v; want ErrDropped", err)
			}
		})
	}
}
