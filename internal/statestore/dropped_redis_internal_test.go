//go:build unix

package statestore

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRedisUnixSocketShutdownDropped: a Redis reached over a Unix socket
// removes the socket at shutdown, so that a dial finds no file
// (ENOENT), not a refusal. Every exchange after the one that met its
// connections closed must still be marked ErrDropped, under a short
// bound (go-redis dials five times, 100 ms apart: the deadline comes
// first) and a long one (the dial's own error, or the pool's last one
// once it stops dialing): the store went down, and may come back empty.
func TestRedisUnixSocketShutdownDropped(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	dial := func() (net.Conn, error) { return net.DialTimeout("unix", sock, time.Second) }
	p := proxytest.StartRedisWith(t, dial, "--port", "0", "--unixsocket", sock)
	r := openRedis(t, "unix://"+sock)
	o := Owner{Replica: "a", Boot: "b"}
	ctx := context.Background()
	if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
		t.Fatal(err)
	}
	proxytest.RedisCommand(dial, "SHUTDOWN NOSAVE", "") // no answer: the server closes it
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("redis-server still running after SHUTDOWN")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket outlived the server: %v", err)
	}
	// Past eight failed dials (PoolSize) the pool answers its last dial
	// error without dialing: marked still.
	bounds := []time.Duration{time.Second, 300 * time.Millisecond, 300 * time.Millisecond}
	for range 10 {
		bounds = append(bounds, 5*time.Second)
	}
	for _, bound := range bounds {
		bctx, cancel := context.WithTimeout(ctx, bound)
		err := r.Heartbeat(bctx, o, time.Minute)
		cancel()
		if !errors.Is(err, ErrDropped) {
			t.Errorf("bound %v: %v: not marked ErrDropped", bound, err)
		}
	}
}

// TestRedisTLSDropsCounted: over TLS (rediss://) the store's dialer
// wraps the TLS connection, which the client does not check before use
// (it cannot peek under TLS): a connection the server closed is counted
// when read, so that an exchange failing after the server's end closed
// its connections, then went silent (a host shutting down), is
// ErrDropped, and one over a link gone silent alone is not.
func TestRedisTLSDropsCounted(t *testing.T) {
	ca := proxytest.NewCA(t)
	cert, key := ca.Issue(t, "127.0.0.1")
	addr := proxytest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	proxytest.StartRedisWith(t, func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	}, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca.File, "--tls-auth-clients", "no")
	for _, c := range []struct {
		name  string
		fault func(*proxytest.Relay)
		// far is closed once the exchange got as far as the case
		// needs: it then ends, rather than by a deadline a loaded
		// machine may let come first (before it read connection 0
		// closed: not ErrDropped).
		far     func(*proxytest.Relay) <-chan struct{}
		dropped bool
	}{
		{"closed, then silent", func(rl *proxytest.Relay) { rl.SetMode(proxytest.RelaySilent); rl.CloseAll() },
			func(rl *proxytest.Relay) <-chan struct{} { return rl.Accepted(2) }, true}, // its retry's dial
		{"silent", func(rl *proxytest.Relay) { rl.SetMode(proxytest.RelaySilent) },
			func(rl *proxytest.Relay) <-chan struct{} { return rl.Swallowed(1) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rl := proxytest.StartRelay(t, addr)
			r := openRedis(t, "rediss://"+rl.Addr()+"/0?skip_verify=true")
			o := Owner{Replica: "a", Boot: "b"}
			if err := r.Heartbeat(context.Background(), o, time.Minute); err != nil {
				t.Fatal(err)
			}
			c.fault(rl)
			ctx := untilFar(t, c.far(rl))
			err := r.Heartbeat(ctx, o, time.Minute)
			if err == nil {
				t.Fatal("answered")
			}
			if errors.Is(err, ErrDropped) != c.dropped {
				t.Errorf("%v: ErrDropped %v, want %v", err, !c.dropped, c.dropped)
			}
		})
	}
}
