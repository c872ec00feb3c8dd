package statestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestWaitPooledConnectionsClosedAnswer: with wait_replicas=1, go-redis
// does not retry (without, once), so an exchange on a pooled connection
// the primary closed while it was idle fails (its outcome unknown, internal/durable's
// breaker open, calls notSaved) unless the pool finds the connection
// closed before it hands it out. Redis closes every client's connection
// when it restarts, and Sentinel has the old primary close them at a
// failover (CLIENT KILL TYPE normal, as here). The pool's check peeks at
// the socket, which a TLS connection does not give it: over TLS
// (rediss://) too, every exchange after the kill must be answered.
func TestWaitPooledConnectionsClosedAnswer(t *testing.T) {
	ca := proxytest.NewCA(t)
	cert, key := ca.Issue(t, "127.0.0.1")
	plain := proxytest.FreeAddr(t)
	secure := proxytest.FreeAddr(t)
	_, pport, _ := net.SplitHostPort(plain)
	_, sport, _ := net.SplitHostPort(secure)
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", plain, time.Second) }
	proxytest.StartRedisWith(t, dial, "--port", pport, "--bind", "127.0.0.1", "--tls-port", sport,
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca.File, "--tls-auth-clients", "no")
	proxytest.StartRedisReplica(t, plain)

	for _, c := range []struct{ name, url string }{
		{"tcp", "redis://" + plain + "/0?wait_replicas=1"},
		{"tls", "rediss://" + secure + "/0?wait_replicas=1&skip_verify=true"},
		// go-redis's one retry meets a second closed connection.
		{"tls without wait", "rediss://" + secure + "/0?skip_verify=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openRedis(t, c.url)
			bg := context.Background()
			// Several pooled connections: exchanges at once.
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					o := Owner{Replica: fmt.Sprint("warm", i), Boot: "b"}
					for range 5 {
						if err := s.Heartbeat(bg, o, time.Minute); err != nil {
							t.Error(err)
						}
						if _, err := s.Get(bg, o.Replica); err != nil && !errors.Is(err, ErrNotFound) {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			if err := proxytest.RedisCommand(dial, "CLIENT KILL TYPE normal", ":"); err != nil {
				t.Fatal(err)
			}
			failed := 0
			for i := range 20 {
				ctx, cancel := context.WithTimeout(bg, 2*time.Second)
				err := s.Heartbeat(ctx, Owner{Replica: "a", Boot: "b"}, time.Minute)
				if err != nil {
					failed++
					t.Logf("write %d after the kill: %v", i, err)
				}
				if _, err := s.Get(ctx, "nothing"); err != nil && !errors.Is(err, ErrNotFound) {
					failed++
					t.Logf("read %d after the kill: %v", i, err)
				}
				cancel()
			}
			if failed > 0 {
				t.Errorf("%d of 40 exchanges after the primary closed its clients' connections failed, want 0", failed)
			}
		})
	}
}

// TestWaitResendCoversFirstSend: a write under WAIT whose connection is
// closed after Redis ran it, before its answer came back, is sent again
// on another connection (resend), where its script finds it landed (a
// versioned write's resent check) and writes nothing. Its WAIT must
// still cover the first send: with the one replica stopped, the write is
// not acknowledged. (Redis 7.0 moves a connection's offset, which WAIT
// counts replicas at, to the primary's after any command, a read too, so
// this passes without the resend's write of waitedKey as well; a server
// that moved it only on a write would count nothing there.)
func TestWaitResendCoversFirstSend(t *testing.T) {
	primary := proxytest.StartRedis(t)
	_, replica := proxytest.StartRedisReplica(t, primary)
	cut := startAnswerCutter(t, primary)
	r := openRedis(t, "redis://"+cut.addr+"/0?wait_replicas=1")
	r.SetLease(0)
	bg := context.Background()
	o := Owner{Replica: "a", Boot: "b"}
	c, err := r.Claim(bg, "rs", o, time.Minute, false)
	must(t, err)
	must(t, r.putVersioned(bg, "rs", "f", []byte("v1"), []byte("h1"), c.Fence, 0, time.Minute))

	must(t, replica.Signal(syscall.SIGSTOP))
	defer replica.Signal(syscall.SIGCONT)
	cut.armed.Store(true) // the script's answer is cut: its connection closed
	ctx, cancel := context.WithTimeout(bg, 2*time.Second)
	defer cancel()
	err = r.putVersioned(ctx, "rs", "f", []byte("v2"), []byte("h2"), c.Fence, 1, time.Minute)
	if cut.armed.Load() {
		t.Fatal("no answer was cut")
	}
	if !errors.Is(err, ErrNotReplicated) {
		t.Errorf("a write resent after its answer was cut, its replica stopped: %v, want ErrNotReplicated", err)
	}
}

// answerCutter relays connections to a server; once armed, it closes the
// client's connection instead of forwarding the next answer that begins
// with an integer reply (a write's script's, not a new connection's
// HELLO), and disarms.
type answerCutter struct {
	addr  string
	armed atomic.Bool
}

func startAnswerCutter(t *testing.T, target string) *answerCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	a := &answerCutter{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); u.Close() })
			go func() { io.Copy(u, c); u.Close() }()
			go func() {
				defer c.Close()
				defer u.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := u.Read(buf)
					if err != nil || buf[0] == ':' && a.armed.CompareAndSwap(true, false) {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return a
}
