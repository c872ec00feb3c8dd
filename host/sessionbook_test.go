package host_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// rawPost sends body to url's MCP endpoint as a client would, with the
// headers given besides, and returns the status and body.
func rawPost(t *testing.T, url, body string, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// openSessions is the wasmtools_http_sessions line of f's metrics.
func openSessions(f *fixture) string {
	rec := httptest.NewRecorder()
	f.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, "wasmtools_http_sessions ") {
			return l
		}
	}
	return "(none)"
}

// connectAs opens a stateful HTTP session with token, returning the
// go-sdk's error rather than failing.
func connectAs(url, token string) (*mcp.ClientSession, error) {
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: tenantTransport{token: token}}}
	return mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
}

// endCalls cancels the calls of ctx and waits for them to end, before the
// clients close: a go-sdk session closed with a call in flight waits for
// its handler, and so for the guest's deadline.
func endCalls(t *testing.T, f *fixture, cancel context.CancelFunc, busy int) {
	cancel()
	eventually(t, "the cancelled calls to end", func() bool { return f.h.BusyInstances() <= busy })
}

// TestSecondInitializeKeepsSessionBooked: a second initialize on a live
// session, which the go-sdk refuses, leaves the session counted. (A review
// found it unbooked: a client sending one after each initialize held any
// number of sessions past MaxSessions, none ever ended to make room.)
func TestSecondInitializeKeepsSessionBooked(t *testing.T) {
	f := newFixture(t, &host.Options{MaxSessions: 2}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	const dup = `{"jsonrpc":"2.0","id":99,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	var all []*mcp.ClientSession
	for range 6 {
		cs := connectHTTP(t, url, "2025-11-25", nil)
		call(t, cs, "count", nil)
		if code, body := rawPost(t, url, dup, http.Header{"Mcp-Session-Id": {cs.ID()}, "Mcp-Protocol-Version": {"2025-11-25"}}); !strings.Contains(body, "duplicate") {
			t.Errorf("second initialize: HTTP %d %.200s, want the go-sdk's refusal", code, body)
		}
		all = append(all, cs)
	}
	if got := openSessions(f); got != "wasmtools_http_sessions 2" {
		t.Errorf("%s, want 2", got)
	}
	live := 0
	for _, cs := range all {
		if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"}); err == nil && !res.IsError {
			live++
		}
	}
	if live > 2 {
		t.Errorf("%d sessions open and served with MaxSessions 2", live)
	}
}

// TestSessionBookDrainsToZero: sessions opening, ending one another to
// make room and closing, concurrently; once every client closed, the book
// holds none.
func TestSessionBookDrainsToZero(t *testing.T) {
	f := newFixture(t, &host.Options{MaxSessions: 3}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	done := make(chan struct{})
	for range 6 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 4 {
				cs, err := connectAs(url, "")
				if err != nil {
					continue // all three busy at that moment
				}
				cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"})
				cs.Close()
			}
		}()
	}
	for range 6 {
		<-done
	}
	eventually(t, "the book to empty", func() bool { return openSessions(f) == "wasmtools_http_sessions 0" })
}

// TestSessionBoundEndsNextLargestTenants: past MaxSessions, when the
// tenant holding the most has every session busy, an idle session of the
// next tenant is ended rather than the initialize refused. alice holds 2
// sessions, both serving a call, and bob 1, idle: the anonymous pool's
// session ends bob's, and so on for six rounds. (A review found one
// tenant holding the most taken, in map order, when tenants tied, and
// the initialize refused although another had an idle session.)
func TestSessionBoundEndsNextLargestTenants(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{MaxSessions: 3, MaxSessionsPerSubject: 2, Tenants: true}, sandbox.NewPolicy(), map[string]string{
		"everything.wasm": testplugins.Example(t, "everything"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx, cancel := context.WithCancel(context.Background())
	busy := f.h.BusyInstances()
	defer endCalls(t, f, cancel, busy)
	for range 2 {
		cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
		go cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_compute", Arguments: map[string]any{"seconds": 600}})
	}
	eventually(t, "alice's calls to run", func() bool { return f.h.BusyInstances() >= busy+2 })
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	anon, err := connectAs(url, shared)
	if err != nil {
		t.Fatalf("the anonymous pool's session, alice's busy and bob's idle: %v", err)
	}
	defer anon.Close()
	if _, err := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "bob"}}); err == nil {
		t.Errorf("bob's idle session served after the anonymous pool's opened past MaxSessions; want it ended")
	}
	for i := range 6 {
		b, err := connectAs(url, bobToken)
		if err != nil {
			t.Fatalf("round %d: bob's session, one of the anonymous pool's idle: %v", i, err)
		}
		a, err := connectAs(url, shared)
		if err != nil {
			t.Fatalf("round %d: the anonymous pool's session, one of bob's idle: %v", i, err)
		}
		b.Close()
		a.Close()
	}
}

// TestDeleteStopsSessionsCalls: a client that deletes its session while a
// call runs (a guest that loops until its deadline) gets the DELETE
// answered, and the guest is stopped. The go-sdk closes a session only
// once its requests are done, so until stop 63 the DELETE waited for the
// guest's deadline (here 3 minutes, past the DELETE's 1), the guest
// holding its instance for a client that had gone. Another user's DELETE
// of the session stops nothing.
func TestDeleteStopsSessionsCalls(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy().WithCallTimeout(3*time.Minute), map[string]string{
		"loop.wasm": testplugins.Test(t, "loop"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	busy := f.h.BusyInstances()
	done := make(chan error, 1)
	go func() {
		_, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin"})
		done <- err
	}()
	eventually(t, "alice's call to run", func() bool { return f.h.BusyInstances() >= busy+1 })
	del := func(token string) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, url+"/mcp", nil)
		req.Header.Set("Mcp-Session-Id", alice.ID())
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		res, err := (&http.Client{Transport: tenantTransport{token: token}}).Do(req)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	if code, err := del(bobToken); err != nil || code/100 == 2 {
		t.Errorf("bob's DELETE of alice's session: %d %v, want refused", code, err)
	}
	if f.h.BusyInstances() < busy+1 {
		t.Errorf("bob's DELETE stopped alice's call")
	}
	start := time.Now()
	if code, err := del(aliceToken); err != nil || code/100 != 2 {
		t.Fatalf("alice's DELETE of her session, a call running: %d %v", code, err)
	}
	t.Logf("DELETE answered in %v", time.Since(start))
	eventually(t, "the call to end", func() bool { return f.h.BusyInstances() <= busy })
	if err := <-done; err == nil {
		t.Errorf("the call of a deleted session returned no error")
	}
}

// listenRaw opens a 2026-07-28 subscriptions/listen stream as token's
// client, subscribing to uris, and returns the stream's first message
// (its acknowledgement, or the refusal) and what closes it.
func listenRaw(t *testing.T, url, token string, uris []string) (string, func()) {
	t.Helper()
	return listenPadded(t, url, token, uris, 0)
}

// listenPadded is listenRaw with a body of size bytes (0: as it comes),
// padded with spaces between its JSON values.
func listenPadded(t *testing.T, url, token string, uris []string, size int) (string, func()) {
	t.Helper()
	params, _ := json.Marshal(map[string]any{
		"_meta": map[string]any{
			"io.modelcontextprotocol/clientCapabilities": map[string]any{},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "1"},
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		},
		"notifications": map[string]any{"resourceSubscriptions": uris},
	})
	ctx, cancel := context.WithCancel(context.Background())
	head, tail := `{"jsonrpc":"2.0","id":1,`, `"method":"subscriptions/listen","params":`+string(params)+`}`
	body := head + strings.Repeat(" ", max(size-len(head)-len(tail), 0)) + tail
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(res.Body).ReadString('}')
	end := func() { cancel(); res.Body.Close() }
	t.Cleanup(end)
	return res.Status + " " + line, end
}

// TestListenFairShares: a 2026-07-28 client's subscriptions/listen
// streams are bounded as sessions are: with MaxSessions 8, each tenant
// holds 2 at once. bob's third is refused (CodeBusy), alice's first is
// acknowledged, and once bob closes one he opens another. Until stop 63
// nothing bounded them: a red team's bob held 64 streams of 256 URIs,
// 143 MiB of the server's memory, with a share of 2 sessions.
func TestListenFairShares(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true, MaxSessions: 8}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	uris := []string{"test://template/1/data", "test://template/2/data"}
	const acked = "notifications/subscriptions/acknowledged"
	var ends []func()
	for i := range 2 {
		first, end := listenRaw(t, url, bobToken, uris)
		if !strings.Contains(first, acked) {
			t.Fatalf("bob's listen %d within his share: %q", i+1, first)
		}
		ends = append(ends, end)
	}
	if first, _ := listenRaw(t, url, bobToken, uris); strings.Contains(first, acked) || !strings.Contains(first, "-32050") {
		t.Errorf("bob's third listen, past his share: %q, want CodeBusy", first)
	}
	if first, _ := listenRaw(t, url, aliceToken, uris); !strings.Contains(first, acked) {
		t.Errorf("alice's listen while bob holds his share: %q", first)
	}
	ends[0]()
	eventually(t, "bob to open a listen again once he closed one", func() bool {
		first, end := listenRaw(t, url, bobToken, uris)
		end()
		return strings.Contains(first, acked)
	})
}

// TestSessionShareOfOne: with a share of one session, each new session of
// bob's ends his previous one, and he never holds two. (Ending a tenant's
// last session dropped its set from the book while the new session went
// into it, so the next was booked against none.)
func TestSessionShareOfOne(t *testing.T) {
	f := newFixture(t, &host.Options{MaxSessions: 8, MaxSessionsPerSubject: 1, Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	var all []*mcp.ClientSession
	for range 4 {
		cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
		call(t, cs, "count", nil)
		all = append(all, cs)
	}
	live := 0
	for _, cs := range all {
		if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"}); err == nil && !res.IsError {
			live++
		}
	}
	if live != 1 {
		t.Errorf("bob holds %d live sessions with a share of 1", live)
	}
	if got := openSessions(f); got != "wasmtools_http_sessions 1" {
		t.Errorf("%s, want 1", got)
	}
}

// TestServerWideRefusalTellsNoUsage: a refusal past a bound of the whole
// server names the bound, not what the server holds, which is other
// tenants' usage too (a tenant review: "the server holds %d listen
// streams"); the operator's metrics say it. Alice's two listens fill a
// server of MaxSessions 2 (her share, 8, is larger); bob's is refused,
// and told nothing of hers.
func TestServerWideRefusalTellsNoUsage(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true, MaxSessions: 2, MaxSessionsPerSubject: 8}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	uris := []string{"test://template/1/data"}
	for i := range 2 {
		if first, _ := listenRaw(t, url, aliceToken, uris); !strings.Contains(first, "notifications/subscriptions/acknowledged") {
			t.Fatalf("alice's listen %d: %q", i+1, first)
		}
	}
	first, _ := listenRaw(t, url, bobToken, uris)
	m := regexp.MustCompile(`"message":"([^"]*)"`).FindStringSubmatch(first)
	if m == nil || !strings.Contains(first, "-32050") {
		t.Fatalf("bob's listen past the server's bound: %q, want CodeBusy", first)
	}
	if !strings.Contains(m[1], "listen streams") || regexp.MustCompile(`[0-9]`).MatchString(m[1]) {
		t.Errorf("bob is told %q; want the bound named (listen streams), with no figure of what the server holds", m[1])
	}
}
