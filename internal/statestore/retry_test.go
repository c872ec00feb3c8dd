package statestore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestLostReplyIsNotRetried loses the reply to a sealed write that Redis
// ran (the relay closes the client's connection instead of passing it
// on). The write fails as unanswered, not as a rollback; it landed, and
// the holder's next write under the same fence reads the record again
// and succeeds. A client that resent the script got "rolled back" for
// that write and every later one of the session.
func TestLostReplyIsNotRetried(t *testing.T) {
	ctx := context.Background()
	var drop atomic.Bool
	s, err := statestore.Open("redis://"+dropRelay(t, proxytest.StartRedis(t), &drop)+"/0", testKey)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := statestore.Owner{Replica: "r", Boot: "b"}
	if err := s.Heartbeat(ctx, o, time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, "x", o, time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "x", "f", []byte("1"), c.Fence, time.Minute); err != nil {
		t.Fatal(err)
	}
	drop.Store(true)
	err = s.Put(ctx, "x", "f", []byte("2"), c.Fence, time.Minute)
	if se := (*statestore.SealError)(nil); err == nil || errors.As(err, &se) {
		t.Fatalf("a write whose reply was lost: %v; want an unanswered error, not a seal error", err)
	}
	if err := s.Put(ctx, "x", "f", []byte("3"), c.Fence, time.Minute); err != nil {
		t.Fatalf("the next write under the same fence: %v", err)
	}
	got, err := s.Get(ctx, "x")
	if err != nil || string(got["f"]) != "3" {
		t.Fatalf("read %q, %v; want f=3", got, err)
	}
}

// dropRelay relays TCP to addr; once drop is set, the next reply from
// the server is swallowed and the client's connection closed.
func dropRelay(t *testing.T, addr string, drop *atomic.Bool) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && drop.CompareAndSwap(true, false) {
						return
					}
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
