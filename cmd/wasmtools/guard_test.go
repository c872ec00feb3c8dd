package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// guardRequest makes a request to one endpoint of a served wasmtools: a
// POST initialize for /mcp, a GET for the others.
func guardRequest(t *testing.T, base, path string, edit func(*http.Request)) (int, string) {
	t.Helper()
	method, body := http.MethodGet, ""
	if path == "/mcp" {
		method, body = http.MethodPost, initializeBody
	}
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	if path == "/mcp" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	}
	edit(req)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestHTTPGuard sends each endpoint of `wasmtools serve --http` each
// check's failing and passing requests (issue 12: /status and /metrics
// answered a rebound Host, any origin and no token).
func TestHTTPGuard(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "wasmtools.toml")
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	closed := write(`
[http]
auth_token = "s3cret"
allowed_origins = ["http://inspector.example"]
`)
	public := write(`
[http]
auth_token = "s3cret"
metrics_public = true
`)
	base, _ := serveInProcess(t, nil, "--no-watch", "--config", closed, dir)
	basePublic, _ := serveInProcess(t, nil, "--no-watch", "--config", public, dir)

	token := func(tok string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	with := func(fs ...func(*http.Request)) func(*http.Request) {
		return func(r *http.Request) {
			for _, f := range fs {
				f(r)
			}
		}
	}
	header := func(k, v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set(k, v) } }
	rebound := func(r *http.Request) { r.Host = "attacker.example:" + r.URL.Port() }
	tests := []struct {
		name  string
		base  string
		paths []string
		edit  func(*http.Request)
		want  int
	}{
		{"with the token", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, token("s3cret"), http.StatusOK},
		{"no token", base, []string{"/mcp"}, func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong token", base, []string{"/mcp"}, token("guess"), http.StatusUnauthorized},
		{"probes without the token", base, []string{"/healthz", "/readyz"}, func(*http.Request) {}, http.StatusOK},
		{"probes: rebound host", base, []string{"/healthz", "/readyz"}, rebound, http.StatusForbidden},
		{"probes: cross-site browser", base, []string{"/healthz", "/readyz"}, with(header("Origin", "http://evil.example"), header("Sec-Fetch-Site", "cross-site")), http.StatusForbidden},
		{"rebound host", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), rebound), http.StatusForbidden},
		{"cross-site browser", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), header("Origin", "http://evil.example"), header("Sec-Fetch-Site", "cross-site")), http.StatusForbidden},
		{"foreign origin, no Sec-Fetch-Site", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), header("Origin", "http://evil.example")), http.StatusForbidden},
		{"null origin", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), header("Origin", "null")), http.StatusForbidden},
		{"allowed origin", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), header("Origin", "http://inspector.example"), header("Sec-Fetch-Site", "cross-site")), http.StatusOK},
		{"same origin", base, []string{"/mcp", "/status", "/metrics", "/healthz"}, with(token("s3cret"), header("Origin", base), header("Sec-Fetch-Site", "same-origin")), http.StatusOK},
		{"allowed origin without the token", base, []string{"/mcp"}, with(header("Origin", "http://inspector.example")), http.StatusUnauthorized},
		// Without an operator credential: the operator is whoever is on
		// this machine (issue 26).
		{"no operator: drain and reload not served", base, []string{"/drain", "/reload"}, token("s3cret"), http.StatusNotFound},
		{"no operator: status and metrics on this machine", base, []string{"/status", "/metrics"}, func(*http.Request) {}, http.StatusOK},
		{"no operator: status and metrics through a proxy", base, []string{"/status", "/metrics"}, with(token("s3cret"), header("X-Forwarded-For", "203.0.113.7")), http.StatusForbidden},
		{"metrics_public: metrics without a token", basePublic, []string{"/metrics"}, func(*http.Request) {}, http.StatusOK},
		{"metrics_public: metrics through a proxy", basePublic, []string{"/metrics"}, header("X-Forwarded-For", "203.0.113.7"), http.StatusOK},
		{"metrics_public: the rest still need it", basePublic, []string{"/mcp"}, func(*http.Request) {}, http.StatusUnauthorized},
		{"metrics_public: the rest still the operator's", basePublic, []string{"/status"}, header("X-Forwarded-For", "203.0.113.7"), http.StatusForbidden},
		{"metrics_public: rebound host", basePublic, []string{"/metrics"}, rebound, http.StatusForbidden},
		{"metrics_public: cross-site browser", basePublic, []string{"/metrics"}, with(header("Origin", "http://evil.example"), header("Sec-Fetch-Site", "cross-site")), http.StatusForbidden},
	}
	for _, tt := range tests {
		for _, path := range tt.paths {
			t.Run(tt.name+path, func(t *testing.T) {
				code, body := guardRequest(t, tt.base, path, tt.edit)
				if code != tt.want {
					t.Errorf("%s: %d, want %d: %s", path, code, tt.want, body)
				}
				if path == "/healthz" && code == http.StatusOK && body != "ok" {
					t.Errorf("/healthz says %q, want ok", body)
				}
				if code != http.StatusOK && (strings.Contains(body, "counter") || strings.Contains(body, "sha256")) {
					t.Errorf("a refusal gives plugin details away: %s", body)
				}
			})
		}
	}
}

// TestHTTPSlowClients holds 100 connections open, sending 1 byte every
// half second, half of them in the headers and half in a body (issue 12:
// such connections stayed open and kept their goroutines). The server must
// close each after its timeout and be back to its goroutines; meanwhile a
// call whose response takes longer than those timeouts is served.
func TestHTTPSlowClients(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"loop.wasm":    testplugins.Test(t, "loop"),
	})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(`
[http]
header_timeout = "2s"
body_timeout = "2s"
idle_timeout = "2s"

[plugins.loop]
call_timeout = "5s"
`), 0o644)
	base, _ := serveInProcess(t, nil, "--no-watch", "--config", cfg, dir)
	addr := strings.TrimPrefix(base, "http://")
	conns := watchConns(t, addr)

	// A long call: its response comes after the body and header timeouts,
	// and must not be cut off by them.
	cs, err := connectURL(t, base, http.DefaultTransport)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin"})
	if err != nil || !res.IsError || !strings.Contains(fmt.Sprint(res.Content[0].(*mcp.TextContent).Text), "timed out") {
		t.Fatalf("a 5s call over HTTP with 2s read timeouts: %v, %+v", err, res)
	}
	if got := callText(t, cs, "count", nil); got != "1" {
		t.Errorf("count after the long call = %s", got)
	}
	cs.Close()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	goroutines := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	// The baseline: the server with no connection open (the server's own
	// report), its goroutines counted once the count holds across a
	// second with no connection event.
	conns.wait(t, "the client's connections closed", func(open, _ int) bool { return open == 0 })
	baseline := conns.settled(goroutines, nil)

	const n = 100
	slowHeader := "GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nX-Slow: "
	slowBody := "POST /mcp HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{"
	start := time.Now()
	var started, done sync.WaitGroup
	closedAfter := make([]time.Duration, n)
	for i := range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				started.Done()
				t.Error(err)
				return
			}
			defer conn.Close()
			first := slowHeader
			if i%2 == 1 {
				first = slowBody
			}
			_, err = io.WriteString(conn, first)
			started.Done()
			buf := make([]byte, 512)
			for err == nil && time.Since(start) < 2*time.Minute {
				conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				_, err = conn.Read(buf)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					_, err = conn.Write([]byte("a")) // one more byte
				}
			}
			closedAfter[i] = time.Since(start)
		}()
	}
	started.Wait()
	conns.wait(t, "the server to accept the slow connections", func(_, accepted int) bool { return accepted >= n })
	peak := goroutines()
	done.Wait()
	slowest := time.Duration(0)
	for _, d := range closedAfter {
		slowest = max(slowest, d)
	}
	// 2s timeouts: 30s leaves room for a loaded machine, and is far from
	// the 2 minutes a connection would otherwise last.
	if slowest > 30*time.Second {
		t.Errorf("the slowest connection was closed after %v; want the 2s timeouts to close it", slowest)
	}
	// The server closed every connection it accepted (its own report),
	// and is back to its goroutines.
	conns.wait(t, "the server to close the slow connections", func(open, _ int) bool { return open == 0 })
	after := conns.settled(goroutines, func(n int) bool { return n <= baseline })
	t.Logf("goroutines: %d before, %d with %d slow connections, %d after; slowest closed after %v", baseline, peak, n, after, slowest.Round(time.Millisecond))
	if after > baseline {
		t.Errorf("%d goroutines after the slow clients left, %d before", after, baseline)
	}
}

// connWatch follows the HTTP server's connections on one address, from
// the server's own reports (connStateHook): how many are open, how many
// were accepted, and a signal at each change.
type connWatch struct {
	mu       sync.Mutex
	open     int
	accepted int
	changed  chan struct{} // closed and replaced at each change
}

// watchConns follows the connections the in-process server on addr
// accepts from now on, until the test ends.
func watchConns(t *testing.T, addr string) *connWatch {
	w := &connWatch{changed: make(chan struct{})}
	hook := func(c net.Conn, s http.ConnState) {
		if c.LocalAddr().String() != addr {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		switch s {
		case http.StateNew:
			w.open++
			w.accepted++
		case http.StateClosed, http.StateHijacked:
			w.open--
		default:
			return
		}
		close(w.changed)
		w.changed = make(chan struct{})
	}
	connStateHook.Store(&hook)
	t.Cleanup(func() { connStateHook.Store(nil) })
	return w
}

// wait waits until cond(open, accepted) holds, woken by each connection
// event, for at most two minutes.
func (w *connWatch) wait(t *testing.T, what string, cond func(open, accepted int) bool) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		w.mu.Lock()
		ok, ch := cond(w.open, w.accepted), w.changed
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// settled returns count() once enough accepts it (nil: never), or once it
// reads the same twice, a second apart, with no connection event between;
// it gives up after 30 s. Goroutines end with no signal: a connection's
// goroutine reports its close just before it returns, and a session's
// goroutines end after its DELETE; the second is the backstop for those.
func (w *connWatch) settled(count func() int, enough func(int) bool) int {
	deadline := time.Now().Add(30 * time.Second)
	n := count()
	for time.Now().Before(deadline) && (enough == nil || !enough(n)) {
		w.mu.Lock()
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Second):
		}
		m := count()
		if m == n {
			return m
		}
		n = m
	}
	return n
}
