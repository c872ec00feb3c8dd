package proxytest_test

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

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
