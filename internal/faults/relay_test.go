package faults

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRelay: the relay forwards requests and answers; armed, it holds back
// the answer to the request that matches, calls sprung once that answer
// has arrived whole (the replica ran the request), and closes: the client
// gets no answer, and the next connection is refused.
func TestRelay(t *testing.T) {
	var ran atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ran.Add(1)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"echo":`+string(b)+`}}`)
	}))
	defer srv.Close()
	rl, err := NewHTTPRelay(proxytest.FreeAddr(t), strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	post := func(body string) (string, error) {
		res, err := http.Post("http://"+rl.Addr+"/mcp", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	if got, err := post(`"one"`); err != nil || !strings.Contains(got, `"echo":"one"`) {
		t.Fatalf("through the relay: %q, %v", got, err)
	}
	var sprung atomic.Int32
	done := rl.Trap(`"note_add"`, func() { sprung.Add(1) })
	if got, err := post(`"two"`); err != nil || !strings.Contains(got, `"echo":"two"`) {
		t.Fatalf("a request the trap does not match: %q, %v", got, err)
	}
	if got, err := post(`"note_add"`); err == nil {
		t.Fatalf("the trapped request was answered: %q", got)
	}
	<-done
	if sprung.Load() != 1 || ran.Load() != 3 {
		t.Fatalf("sprung %d times, the server ran %d requests; want 1 and 3", sprung.Load(), ran.Load())
	}
	if _, err := post(`"three"`); err == nil {
		t.Fatal("the relay still listens after its trap sprang")
	}

	// The server gone (the relay not told yet): 503, as the replica's own
	// refusal of a request that never ran, which proxies send on.
	srv.Close()
	if err := rl.Open(); err != nil {
		t.Fatal(err)
	}
	res, err := http.Post("http://"+rl.Addr+"/mcp", "application/json", strings.NewReader(`"four"`))
	if err != nil {
		t.Fatalf("the server gone: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("the server gone: %s, want 503", res.Status)
	}
}

// TestRelayCut: a cut relay forwards nothing either way and closes
// nothing, and accepts new connections without connecting them; healed,
// it delivers what it held, a connection's bytes and close included, though
// their sender gave up on them (a store exchange that timed out during a
// partition reaches Redis late).
func TestRelayCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 8) // what each connection sent, once it closed
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var all []byte
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						all = append(all, buf[:n]...)
						c.Write(buf[:n]) // echo
					}
					if err != nil {
						got <- string(all)
						return
					}
				}
			}()
		}
	}()
	rl, err := NewRelay(proxytest.FreeAddr(t), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", rl.Addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	echo := func(c net.Conn, want string) error {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		b := make([]byte, len(want))
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		if string(b) != want {
			return fmt.Errorf("echo %q, want %q", b, want)
		}
		return nil
	}
	open := dial()
	defer open.Close()
	open.Write([]byte("a"))
	if err := echo(open, "a"); err != nil {
		t.Fatalf("through the relay: %v", err)
	}

	rl.Cut()
	open.Write([]byte("b"))
	late := dial() // accepted, not connected
	defer late.Close()
	late.Write([]byte("c"))
	gaveUp := dial()
	gaveUp.Write([]byte("d"))
	gaveUp.Close()
	open.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := open.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a cut relay answered: %d bytes, %v", n, err)
	}
	select {
	case s := <-got:
		t.Fatalf("a connection ended through a cut relay, having sent %q", s)
	default:
	}

	rl.Heal()
	if err := echo(open, "b"); err != nil {
		t.Fatalf("held bytes after the heal: %v", err)
	}
	if err := echo(late, "c"); err != nil {
		t.Fatalf("a connection accepted during the cut, after the heal: %v", err)
	}
	select {
	case s := <-got:
		if s != "d" {
			t.Fatalf("a connection closed during the cut delivered %q, want %q", s, "d")
		}
	case <-time.After(time.Minute):
		t.Fatal("a connection closed during the cut was not delivered after the heal")
	}
}
