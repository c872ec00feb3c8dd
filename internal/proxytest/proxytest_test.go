package proxytest_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// recorder is a testing.TB that records a Fatal or Skip and ends its
// goroutine, as the real ones do.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Skip(args ...any)  { r.skip = fmt.Sprint(args...); runtime.Goexit() }

// TestBinaryMissing: a missing server fails the test under CI and skips it
// elsewhere, naming the package to install.
func TestBinaryMissing(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			proxytest.Binary(r, "no-such-server-here", "no-such-package")
		}()
		<-done
		got, other := r.skip, r.fatal
		if ci != "" {
			got, other = r.fatal, r.skip
		}
		if !strings.Contains(got, "apt-get install no-such-package") || other != "" {
			t.Errorf("CI=%q: fatal %q, skip %q", ci, r.fatal, r.skip)
		}
	}
}

// TestSentinel: a replica started by StartRedisReplica is synced, a
// Sentinel started by StartSentinel names the primary and knows the
// replica, and after the primary is killed it names the replica
// (WaitSentinelMaster), which RedisArray and SentinelMaster read.
func TestSentinel(t *testing.T) {
	primary := proxytest.FreeAddr(t)
	p := proxytest.StartRedisAt(t, primary)
	replica, _ := proxytest.StartRedisReplica(t, primary)
	sentinel, _ := proxytest.StartSentinel(t, "m", primary, 1)
	if got, err := proxytest.SentinelMaster(sentinel, "m"); err != nil || got != primary {
		t.Fatalf("master %s (%v), want %s", got, err, primary)
	}
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", sentinel, time.Second) }
	if _, err := proxytest.RedisArray(dial, "SENTINEL get-master-addr-by-name nobody"); err != nil {
		t.Errorf("an unknown master: %v, want a nil array", err)
	}
	if _, err := proxytest.RedisArray(dial, "NOSUCHCOMMAND"); err == nil {
		t.Error("an error reply read as an array")
	}
	p.Signal(syscall.SIGKILL)
	<-p.Done()
	proxytest.WaitSentinelMaster(t, sentinel, "m", replica, 30*time.Second)
}

// TestRedisReplicaAcknowledges: once StartRedisReplica returns, a write
// on the primary and WAIT 1 are answered 1 within a short bound, as a
// store's first write with wait_replicas must be. The replica's
// acknowledgement of its full sync can reach a primary that has not yet
// seen the sync's end (its child not yet reaped); the primary then
// streams nothing to it until the next one, a second later, and a WAIT
// in between answers 0. The primary syncs at once (no delay), as often
// as -count asks.
func TestRedisReplicaAcknowledges(t *testing.T) {
	primary := proxytest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(primary)
	proxytest.StartRedisWith(t, func() (net.Conn, error) { return net.DialTimeout("tcp", primary, time.Second) },
		"--port", port, "--bind", "127.0.0.1", "--repl-diskless-sync-delay", "0")
	proxytest.StartRedisReplica(t, primary)
	rc := redis.NewClient(&redis.Options{Addr: primary})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A replica streamed to answers in well under a millisecond. The
	// bound is a second, as tests here go (a loaded machine), so this
	// fails before WaitReplica less often than it did at 300 ms (5 runs
	// in 40), only when the next acknowledgement is late too.
	n, err := rc.Wait(ctx, 1, time.Second).Result()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1 right after StartRedisReplica: %d (%v), want 1", n, err)
	}
}
