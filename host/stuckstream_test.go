package host_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// watchedListener gives each accepted connection a small send buffer
// (4 KiB, which also stops the kernel growing it), so that a client that
// stops reading fills it with kilobytes, not the megabytes the kernel
// otherwise allows on loopback, and watches its writes.
type watchedListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[string]*watchedConn // by the client's address
}

func (l *watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	wc := &watchedConn{Conn: c, stuck: make(chan struct{}), failed: make(chan struct{})}
	l.mu.Lock()
	l.conns[c.RemoteAddr().String()] = wc
	l.mu.Unlock()
	return wc, nil
}

func (l *watchedListener) conn(client net.Addr) *watchedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[client.String()]
}

// watchedConn says when a write to it has not returned for 2 s (its
// client's buffers and its own are full) and when one failed.
type watchedConn struct {
	net.Conn
	stuckOnce, failOnce sync.Once
	stuck, failed       chan struct{}
	err                 error // the first write's error, once failed is closed
}

func (c *watchedConn) Write(p []byte) (int, error) {
	t := time.AfterFunc(2*time.Second, func() { c.stuckOnce.Do(func() { close(c.stuck) }) })
	n, err := c.Conn.Write(p)
	t.Stop()
	if err != nil {
		c.failOnce.Do(func() { c.err = err; close(c.failed) })
	}
	return n, err
}

// noStandingStream answers a go-sdk client's standing GET with 405, so
// that the test opens that session's stream itself.
type noStandingStream struct{}

func (noStandingStream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet {
		return &http.Response{StatusCode: http.StatusMethodNotAllowed, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestStuckStreamHoldsNoListChanged: bob's 2025-11-25 session opens its
// standing GET stream over a connection with a small receive buffer and
// never reads past its first event; his own resource updates fill it.
// Then a plugin is deployed. The go-sdk (v1.8.0) sends list_changed to
// its sessions one after another from one goroutine (notifySessions),
// each written straight to the connection: a review found the writes had
// no deadline, so the one to bob's stream blocked forever, and alice, a
// session after his, was never told (nor any later change: one goroutine
// more blocked behind it each time). A write to a stream that does not
// go through within StreamWriteTimeout ends that stream; bob, resuming
// from the last event he read, is given what he missed, list_changed
// included. A 2026-07-28 listener is told too (its era has a go-sdk
// server of its own, which bob's stream never held up).
func TestStuckStreamHoldsNoListChanged(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{"hostileupdate.wasm": testplugins.Bytes(t, testplugins.Test(t, "hostileupdate"))})
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	srv := httptest.NewUnstartedServer(mux)
	wl := &watchedListener{Listener: srv.Listener, conns: map[string]*watchedConn{}}
	srv.Listener = wl
	srv.Start()
	t.Cleanup(srv.Close)
	ctx := context.Background()

	bob := connectHTTP(t, srv.URL, "2025-11-25", noStandingStream{})
	if err := bob.Subscribe(ctx, &mcp.SubscribeParams{URI: "flood://item/1"}); err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 16)
	onChange := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}
	alice := connectHTTPEra(t, srv.URL, "2025-11-25", onChange, nil)
	listenChanged := make(chan struct{}, 16)
	connectHTTPEra(t, srv.URL, "2026-07-28", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { listenChanged <- struct{}{} }}, nil)

	// Bob's standing stream, read up to its priming event.
	head := fmt.Sprintf("GET /mcp HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n", srv.Listener.Addr(), bob.ID())
	wc, line := openStuck(t, srv, wl, head, "id: ")
	primed := strings.TrimPrefix(line, "id: ")

	// Bob's updates, until the host cannot write to his stream.
	if !fillStuck(bob, wc) {
		t.Fatal("bob's stream never filled")
	}

	f.deploy(t, "counter.wasm", testplugins.Bytes(t, testplugins.Example(t, "counter")))
	notified(t, changed, "tools/list_changed to alice, past bob's stream that does not read")
	notified(t, listenChanged, "tools/list_changed to a 2026-07-28 listener")
	select {
	case <-wc.failed:
		if !errors.Is(wc.err, os.ErrDeadlineExceeded) {
			t.Errorf("bob's stream ended by %v, want its write deadline", wc.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bob's stream was not ended")
	}
	// Another change reaches alice: nothing is held up any more.
	f.deploy(t, "hash.wasm", testplugins.Bytes(t, testplugins.Example(t, "hash")))
	notified(t, changed, "tools/list_changed to alice after bob's stream was ended")

	// Bob resumes from the last event he read and is given the rest,
	// both changes included.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", bob.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Last-Event-ID", primed)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	time.AfterFunc(30*time.Second, cancel) // the scan below ends
	resumed, err := http.DefaultClient.Do(req.WithContext(rctx))
	if err != nil {
		t.Fatal(err)
	}
	if resumed.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resumed.Body)
		t.Fatalf("bob's resumption from %q: %v %q", primed, resumed.Status, b)
	}
	defer resumed.Body.Close()
	sc := bufio.NewScanner(resumed.Body)
	sc.Buffer(nil, 1<<20)
	changes := 0
	for changes < 2 && sc.Scan() {
		if strings.Contains(sc.Text(), "notifications/tools/list_changed") {
			changes++
		}
	}
	if changes < 2 {
		t.Fatalf("bob's resumed stream carried %d tools/list_changed, want 2: %v", changes, sc.Err())
	}
	if got := text(call(t, alice, "count", nil)); got != "1" {
		t.Fatalf("alice's count: %q", got)
	}
}
