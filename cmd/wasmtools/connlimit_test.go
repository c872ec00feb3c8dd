package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestMaxConnections fills `serve --max-connections 8` with connections
// that never finish their headers (a slow-loris peer: each held until the
// header timeout, what the fd limit alone bounded) and shows the next one
// refused at once with a 503, without the server accepting it, then the
// slots given back by a client's close and by the header timeout, so that
// a legitimate client gets in.
func TestMaxConnections(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte("[http]\nheader_timeout = \"2s\"\n"), 0o644)
	const max = 8
	base, stderr := serveInProcess(t, nil, "--no-watch", "--config", cfg, "--max-connections", "8", dir)
	addr := strings.TrimPrefix(base, "http://")
	conns := watchConns(t, addr)

	// slow opens a connection that sends part of a request's headers and
	// never the rest.
	slow := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// refused opens a connection past the cap, sends nothing, and wants
	// a 503 and the connection closed, at once rather than at the header
	// timeout (2 s; bound 30 s for a loaded machine).
	refused := func(what string) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c)
		if !strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
			t.Fatalf("%s: read %q (%v), want a 503 and the connection closed", what, b, err)
		}
	}
	healthy := func(what string) {
		t.Helper()
		if code, body := guardRequest(t, base, "/healthz", func(*http.Request) {}); code != http.StatusOK {
			t.Errorf("%s: /healthz: %d %s, want 200", what, code, body)
		}
	}

	held := make([]net.Conn, 0, max)
	for range max {
		held = append(held, slow())
	}
	conns.wait(t, "the server to accept the slow connections", func(open, _ int) bool { return open == max })
	refused("the connection past the cap")
	refused("a second connection past the cap")
	conns.mu.Lock()
	if conns.accepted != max {
		t.Errorf("the server accepted %d connections, want %d: those past the cap must not reach it", conns.accepted, max)
	}
	conns.mu.Unlock()

	// A client's close gives its slot back.
	held[0].Close()
	conns.wait(t, "the server to close the connection its client closed", func(open, _ int) bool { return open == max-1 })
	healthy("with a slot given back by a close")
	conns.wait(t, "the healthy client's connection closed", func(open, _ int) bool { return open == max-1 })
	slow()
	conns.wait(t, "the server to accept the slot's new slow connection", func(open, _ int) bool { return open == max })
	refused("the connection past the cap, again")

	// The header timeout gives the rest back.
	conns.wait(t, "the header timeout to close the slow connections", func(open, _ int) bool { return open == 0 })
	healthy("after the header timeout")

	// Headers past http.max_header_bytes (16 KiB, and the 4 KiB net/http
	// reads more) are refused.
	big := func(r *http.Request) { r.Header.Set("X-Big", strings.Repeat("a", 24<<10)) }
	if code, _ := guardRequest(t, base, "/healthz", big); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("24 KiB of headers: %d, want 431", code)
	}

	// Logged once per burst of refusals (two bursts), and counted.
	if n := strings.Count(stderr.String(), `msg="connections refused`); n != 2 {
		t.Errorf("%d log lines of connections refused, want 2 (one per burst):\n%s", n, stderr)
	}
	if code, body := guardRequest(t, base, "/metrics", func(*http.Request) {}); code != http.StatusOK || !strings.Contains(body, "\nwasmtools_http_connections_refused_total 3\n") {
		t.Errorf("/metrics: %d, want wasmtools_http_connections_refused_total 3:\n%s", code, body)
	}
}
