package proxytest_test

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRelay: a relay to an echo server forwards while RelayPass,
// swallows while RelaySilent (the connection open, a new one accepted,
// the send counted: Swallowed),
// resets a connection its client sends on while RelayReset, answers
// -LOADING while RelayLoading, cuts an answer once armed (CutAnswer),
// and refuses dials once stopped.
func TestRelay(t *testing.T) {
	addr, accepted := proxytest.Listen(t)
	go func() {
		for c := range accepted {
			go io.Copy(c, c)
		}
	}()
	rl := proxytest.StartRelay(t, addr)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", rl.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// exchange sends "ping" and returns what comes back within d.
	exchange := func(c net.Conn, d time.Duration) (string, error) {
		if _, err := c.Write([]byte("ping")); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	c := dial()
	<-rl.Accepted(1)
	if got, err := exchange(c, 10*time.Second); got != "ping" {
		t.Fatalf("pass: %q, %v", got, err)
	}
	rl.SetMode(proxytest.RelaySilent)
	if got, err := exchange(c, 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("silent: %q, %v; want no answer", got, err)
	}
	<-rl.Swallowed(1)
	dial()
	<-rl.Accepted(2)
	rl.SetMode(proxytest.RelayLoading)
	if got, err := exchange(c, 10*time.Second); got != "-LOADING Redis is loading the dataset in memory\r\n" {
		t.Fatalf("loading: %q, %v", got, err)
	}
	rl.SetMode(proxytest.RelayPass)
	cut := rl.CutAnswer([]byte("ng"))
	if got, err := exchange(c, 10*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("cut: %q, %v; want ECONNRESET", got, err)
	}
	<-cut
	c = dial()
	<-rl.Accepted(3)
	rl.SetMode(proxytest.RelayReset)
	if got, err := exchange(c, 10*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reset: %q, %v; want ECONNRESET", got, err)
	}
	select {
	case <-rl.Swallowed(2):
		t.Fatal("a send swallowed but while RelaySilent")
	default:
	}
	rl.Stop()
	if c, err := net.Dial("tcp", rl.Addr()); err == nil {
		c.Close()
		t.Fatal("stopped: dial accepted")
	}
}
