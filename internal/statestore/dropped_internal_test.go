//go:build unix

package statestore

import (
	"context"
	"net"
	"syscall"
	"testing"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestDropsCounted: a dial refused counts, and so does a connection the
// other end closed, when read or when closed unread (the client's check
// of a pooled connection closes it so); closing one the other end keeps
// open (an idle connection reaped) does not.
func TestDropsCounted(t *testing.T) {
	addr, accepted := proxytest.Listen(t)
	d := &drops{}
	dial := d.dialer((&net.Dialer{}).DialContext)
	open := func() (net.Conn, net.Conn) {
		t.Helper()
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := c.(interface {
			SyscallConn() (syscall.RawConn, error)
		}); !ok {
			t.Fatal("a TCP connection's wrapper hides its socket from the client's check")
		}
		return c, <-accepted
	}
	want := uint64(0)
	check := func(what string, counted bool) {
		t.Helper()
		if counted {
			want++
		}
		if got := d.n.Load(); got != want {
			t.Fatalf("%s: %d drops; want %d", what, got, want)
		}
	}

	c, s := open()
	c.Close()
	s.Close()
	check("closed here, the other end open", false)

	c, s = open()
	s.Close()
	c.Read(make([]byte, 1))
	check("read after the other end closed", true)
	c.Close()
	check("closed after that read", false)

	c, s = open()
	s.Close()
	// Once the FIN is in, unread: a peek says so, and the wait is for
	// the socket's next readiness only while it does not (one that
	// came before the wait began is not reported again: a callback that
	// waited once regardless waited here for a minute when the FIN was
	// in first).
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN
	})
	c.Close()
	check("closed unread after the other end closed", true)

	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := other.Addr().String()
	other.Close()
	if _, err := dial(context.Background(), "tcp", closedAddr); err == nil {
		t.Fatal("dialed a closed port")
	}
	check("dial refused", true)
}
