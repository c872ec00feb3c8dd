package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestMain lets the test binary be the wasmtools binary: a test runs
// os.Args[0] with WASMTOOLS_TEST_MAIN=1 to get a real wasmtools process.
func TestMain(m *testing.M) {
	if os.Getenv("WASMTOOLS_TEST_MAIN") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// lockedBuffer collects a subprocess's stderr while the test reads it.
type lockedBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced by every Write
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.written != nil {
		close(l.written)
		l.written = nil
	}
	return l.b.Write(p)
}

// waitFor waits until what was written satisfies ok, woken by each write
// (the server's log is its readiness signal), or until deadline; it
// reports whether ok held.
func (l *lockedBuffer) waitFor(deadline time.Time, ok func(string) bool) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		l.mu.Lock()
		s := l.b.String()
		if l.written == nil {
			l.written = make(chan struct{})
		}
		written := l.written
		l.mu.Unlock()
		if ok(s) {
			return true
		}
		select {
		case <-written:
		case <-timer.C:
			return ok(l.String())
		}
	}
}

// contains is a waitFor condition: every one of subs was written.
func contains(subs ...string) func(string) bool {
	return func(s string) bool {
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				return false
			}
		}
		return true
	}
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// connectStdio starts `wasmtools serve args...` and connects to it.
func connectStdio(t *testing.T, stderr *lockedBuffer, args ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait}, args...)...)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\nstderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { cs.Close() })
	// Ready once the plugins' first load is done (it runs while serving).
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded")) {
		t.Fatalf("the plugins did not load:\n%s", stderr)
	}
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, tool string, args any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("call %s: error result %v", tool, res.Content)
	}
	return res.Content[0].(*mcp.TextContent).Text
}

func TestServeStdio(t *testing.T) {
	// The example folder but notes, which no call here uses, and whose
	// load takes seconds under the race detector.
	dir := testplugins.Folder(t, map[string]string{
		"hash.wasm":    testplugins.Example(t, "hash"),
		"counter.wasm": testplugins.Example(t, "counter"),
		"servlet.wasm": testplugins.Test(t, "servlet"),
	})
	os.WriteFile(dir+"/broken.wasm", []byte("this is not wasm"), 0o644)
	var stderrA, stderrB lockedBuffer
	a := connectStdio(t, &stderrA, dir)
	// b only counts: counter alone spares it the Go plugins' loads,
	// seconds each under the race detector.
	b := connectStdio(t, &stderrB, testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")}))

	res, err := a.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 14 {
		t.Errorf("%d tools, want 14 (broken.wasm skipped)", len(res.Tools))
	}
	if got := callText(t, a, "hash", map[string]any{"text": "abc", "algorithm": "sha1"}); got != "a9993e364706816aba3e25717850c26c9cd0d89d" {
		t.Errorf("sha1(abc) = %s", got)
	}
	// Two processes, two clients: each counts on its own.
	for _, want := range []string{"1", "2", "3"} {
		if got := callText(t, a, "count", nil); got != want {
			t.Errorf("a: count = %s, want %s", got, want)
		}
	}
	if got := callText(t, b, "count", nil); got != "1" {
		t.Errorf("b: count = %s, want 1", got)
	}
	// A guest writing to stdout must not corrupt the stdio transport.
	if got := callText(t, a, "print", map[string]any{"text": "stdout-marker"}); got != "printed" {
		t.Errorf("print = %s", got)
	}
	if got := callText(t, a, "echo", map[string]any{"text": "still talking"}); got != "still talking" {
		t.Errorf("echo after print = %s", got)
	}
	a.Close()
	logs := stderrA.String()
	for _, want := range []string{`msg="guest stdout"`, "line=stdout-marker", "broken.wasm", "not a WebAssembly module"} {
		if !strings.Contains(logs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, logs)
		}
	}
}

func freeAddr(t *testing.T) string { return proxytest.FreeAddr(t) }

func TestServeHTTP(t *testing.T) {
	// notes alone: its per-client state is what the sessions show, and
	// the other Go plugins' loads would take seconds each under the race
	// detector.
	dir := testplugins.Folder(t, map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stderr lockedBuffer
	exited := make(chan int)
	go func() {
		exited <- run(ctx, []string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr, "--client-header", "X-Client", dir}, nil, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	}()
	endpoint := "http://" + addr + "/mcp"
	// The server's log says when it listens.
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("serving MCP over streamable HTTP")) {
		t.Fatalf("the server did not start:\n%s", stderr.String())
	}
	connect := func(protocol, client string) *mcp.ClientSession {
		t.Helper()
		tr := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: clientHeader(client)}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
		if err != nil {
			t.Fatalf("connect %s: %v\n%s", endpoint, err, stderr.String())
		}
		return cs
	}
	// Two sessions (2025-11-25, Mcp-Session-Id) and two sessionless
	// clients (2026-07-28, told apart by --client-header), interleaved.
	a, b := connect("2025-11-25", ""), connect("2025-11-25", "")
	c, d := connect("", "carol"), connect("", "dave")
	clients := []*mcp.ClientSession{a, b, c, d}
	for i, cs := range clients {
		callText(t, cs, "note_add", map[string]any{"text": fmt.Sprint("from client ", i)})
	}
	for i, cs := range clients {
		if got, want := callText(t, cs, "note_list", nil), fmt.Sprint("1. from client ", i, "\n"); got != want {
			t.Errorf("client %d sees %q, want %q", i, got, want)
		}
	}
	if c.InitializeResult().ProtocolVersion < "2026-07-28" {
		t.Errorf("c negotiated %s", c.InitializeResult().ProtocolVersion)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `wasmtools_instances_live{plugin="notes"} 4`) {
		t.Errorf("/metrics lacks 4 live notes instances:\n%s", metrics)
	}
	for _, cs := range clients {
		cs.Close()
	}
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("serve exited %d\n%s", code, stderr.String())
		}
	case <-time.After(startupTimeout):
		t.Fatal("serve did not stop on cancel")
	}
}

// clientHeader is an HTTP transport that sends X-Client when client is set.
type clientHeader string

func (c clientHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	if c != "" {
		r = r.Clone(r.Context())
		r.Header.Set("X-Client", string(c))
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestInspect(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"inspect", "--json", testplugins.Example(t, "hash")}, nil, nil, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var in inspection
	if err := json.Unmarshal(out.Bytes(), &in); err != nil {
		t.Fatal(err)
	}
	if in.Interface != "v2" || len(in.Tools) != 2 || len(in.SHA256) != 64 || in.Size == 0 {
		t.Errorf("inspection: %+v", in)
	}
	if in.Snapshot == nil || !in.Snapshot.Host || in.Snapshot.Reason != "" || !in.Snapshot.Images {
		t.Errorf("snapshot: %+v, want the host able to snapshot hash, and images", in.Snapshot)
	}
	var wasi bool
	for _, f := range in.Imports {
		wasi = wasi || f.Module == "wasi_snapshot_preview1"
	}
	if !wasi || len(in.Exports) == 0 {
		t.Errorf("imports/exports missing: %d imports, %d exports", len(in.Imports), len(in.Exports))
	}

	out.Reset()
	code = run(context.Background(), []string{"inspect", "--json", testplugins.Test(t, "missingimport")}, nil, nil, &out, &errb)
	json.Unmarshal(out.Bytes(), &in)
	if code != 1 || !strings.Contains(in.Error, "extism:host/user.launch_missiles") || len(in.Imports) != 1 {
		t.Errorf("missing import: exit %d, %+v", code, in)
	}

	out.Reset()
	if code := run(context.Background(), []string{"inspect", testplugins.Example(t, "counter")}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"interface: servlet", "count", "extism:host/env.output_set (i64, i64) -> ()", "snapshot:  yes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}

	// hostilehost grows its table: the host cannot snapshot it, and
	// says why.
	out.Reset()
	if code := run(context.Background(), []string{"inspect", "--json", testplugins.Test(t, "hostilehost")}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	in = inspection{}
	json.Unmarshal(out.Bytes(), &in)
	if in.Snapshot == nil || in.Snapshot.Host || !strings.Contains(in.Snapshot.Reason, "table.grow") || in.Snapshot.Images {
		t.Errorf("hostilehost snapshot: %+v, want refused naming table.grow", in.Snapshot)
	}
	if in.Snapshot.PreInitialize {
		t.Error("hostilehost: pre-initialisation reported, but it exports no wizer.initialize")
	}

	// The servlet exports Wizer's pre-initialisation.
	out.Reset()
	if code := run(context.Background(), []string{"inspect", testplugins.Test(t, "servlet")}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := "pre-init:  wizer.initialize runs once, before the image is kept"; !strings.Contains(out.String(), want) {
		t.Errorf("servlet: text output lacks %q:\n%s", want, out.String())
	}
}

func TestCall(t *testing.T) {
	// A grant under a misspelt plugin name reaches no plugin: the call
	// says so (the plugin's own name is its file's). Any plugin shows it:
	// counter loads in milliseconds, a Go plugin in seconds under -race.
	typo := filepath.Join(t.TempDir(), "typo.toml")
	if err := os.WriteFile(typo, []byte("[plugins.countr]\nallowed_hosts = [\"example.com\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err string
	}{
		{"ok", []string{testplugins.Example(t, "hash"), "hash", `{"text":"abc","algorithm":"md5"}`}, 0, "900150983cd24fb0d6963f7d28e17f72", ""},
		{"no arguments", []string{testplugins.Example(t, "counter"), "count"}, 0, `"text": "1"`, ""},
		{"bad arguments", []string{testplugins.Example(t, "hash"), "hash", `{"text":1}`}, 1, "", "invalid arguments"},
		// Any plugin lacks the tool: counter loads in milliseconds, a Go
		// plugin in seconds under the race detector.
		{"unknown tool", []string{testplugins.Example(t, "counter"), "nope"}, 1, "", `has no tool "nope"`},
		{"guest error", []string{testplugins.Test(t, "servlet"), "fail"}, 1, "", "failed on purpose"},
		{"trap", []string{testplugins.Test(t, "trap"), "boom"}, 1, "", "unreachable"},
		// Host functions, as under serve (issue 14).
		{"progress", []string{testplugins.Example(t, "longtask"), "primes", `{"below":50}`}, 0, "15 primes below 50", "progress: 50/50 done"},
		{"log", []string{testplugins.Test(t, "pdkhost"), "log", `{"level":"warning","message":"careful"}`}, 0, "", `log warning: "careful"`},
		{"records", []string{testplugins.Test(t, "pdkhost"), "record", `{"count":2}`}, 0, "", `record test.pdkhost: {"i":1,"pad":""}`},
		{"answer", []string{"--answer", `{"name":"bob"}`, testplugins.Test(t, "pdkhost"), "ask", `{"rounds":1}`}, 0, "accept:bob", ""},
		{"decline", []string{"--answer", `{"action":"decline"}`, testplugins.Test(t, "pdkhost"), "ask", `{"rounds":1}`}, 0, "decline", ""},
		{"question without a terminal", []string{testplugins.Test(t, "pdkhost"), "ask", `{"rounds":1}`}, 1, "", "stdin is not a terminal: answer with --answer JSON"},
		{"config for another plugin", []string{"--config", typo, testplugins.Example(t, "counter"), "count"}, 0, `"text": "1"`, `[plugins.counter]`},
		{"usage", []string{"only-a-file.wasm"}, 2, "", "Usage"},
		// The fallback interruption, wazero's own check.
		{"interrupt wazero", []string{"--interrupt", "wazero", testplugins.Example(t, "hash"), "hash", `{"text":"abc","algorithm":"md5"}`}, 0, "900150983cd24fb0d6963f7d28e17f72", ""},
		{"interrupt unknown", []string{"--interrupt", "fuel", testplugins.Example(t, "hash"), "hash", `{"text":"abc"}`}, 2, "", "neither flag nor wazero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"call", "--cache-dir", testplugins.CacheDir()}, tt.args...), nil, nil, &out, &errb)
			if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
		})
	}
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, nil, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "Usage") {
		t.Errorf("no args: exit %d, %s", code, errb.String())
	}
	if code := run(context.Background(), []string{"serve"}, nil, nil, &out, &errb); code != 2 {
		t.Errorf("serve with no path: exit %d", code)
	}
	if code := run(context.Background(), []string{"frobnicate"}, nil, nil, &out, &errb); code != 2 {
		t.Errorf("unknown command: exit %d", code)
	}
	// A store URL's parameters are checked before anything loads.
	for _, c := range []struct{ url, says string }{
		{"redis://127.0.0.1:1/0?wait_replicas=none", "wait_replicas"},
		{"redis://127.0.0.1:1/0?master_name=wt&wait_timout=1s", "unexpected option: wait_timout"},
		{"redis://u:secret@127.0.0.1:1/0?bogus=1", "unexpected option: bogus"},
		{"rediss://u:secret@127.0.0.1:1/0?tls_ca_file=/nonexistent/ca.pem", `tls_ca_file=\"/nonexistent/ca.pem\": no such file or directory`},
		{"rediss://127.0.0.1:1/0?tls_cert_file=/nonexistent/cert.pem", "tls_cert_file and tls_key_file go together"},
	} {
		out.Reset()
		errb.Reset()
		code := run(context.Background(), []string{"serve", "--state-store", c.url, t.TempDir()}, nil, nil, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.says) || strings.Contains(errb.String(), "secret") {
			t.Errorf("serve --state-store %s: exit %d, %s; want 2, saying %q", c.url, code, errb.String(), c.says)
		}
	}
}

// TestRedactURL: a store URL is logged without its passwords, the
// userinfo's and a Sentinel URL's password= (the primary's).
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"file:/x/s.db":              "file:/x/s.db",
		"redis://h:6379/0":          "redis://h:6379/0",
		"redis://u:secret@h:6379/0": "redis://u:xxxxx@h:6379/0",
		"redis://:s1@s:26379/0?master_name=wt&password=secret&wait_replicas=1": "redis://:xxxxx@s:26379/0?master_name=wt&password=xxxxx&wait_replicas=1",
		// A query that does not parse is hidden whole: url.Query drops
		// the pair it cannot read, a password among them.
		"redis://s:26379/0?master_name=wt&password=sec;ret": "redis://s:26379/0?xxxxx",
		"redis://u:secret@h:6379/0?password=sec%zzret":      "redis://u:xxxxx@h:6379/0?xxxxx",
		// The TLS files' paths are not secrets (the key is in the
		// file): kept.
		"rediss://h:6379/0?tls_ca_file=/etc/r/ca.pem&tls_cert_file=/etc/r/c.pem&tls_key_file=/etc/r/k.pem":           "rediss://h:6379/0?tls_ca_file=/etc/r/ca.pem&tls_cert_file=/etc/r/c.pem&tls_key_file=/etc/r/k.pem",
		"rediss://:s1@s:26379/0?master_name=wt&password=secret&tls_cert_file=/etc/r/c.pem&tls_key_file=/etc/r/k.pem": "rediss://:xxxxx@s:26379/0?master_name=wt&password=xxxxx&tls_cert_file=%2Fetc%2Fr%2Fc.pem&tls_key_file=%2Fetc%2Fr%2Fk.pem",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%s) = %s, want %s", in, got, want)
		}
	}
}

// startupTimeout bounds waits for a server to start or react. Generous:
// under the race detector, on 2 cores, with a cold compilation cache, a
// server compiles several Go plugins before it serves.
const startupTimeout = 3 * time.Minute

// testLoadWait is the --load-wait of the servers the tests start: a
// request waits for the plugins' first load as long as it takes. The
// default (10 s) is for people; a cold compile under the race detector on
// a loaded machine takes longer, and a test that called at once would
// find no tool.
const testLoadWait = "5m"
