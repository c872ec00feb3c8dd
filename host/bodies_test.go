package host_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
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

// TestRequestBytesUnknownLength: a body of unknown length (chunked) is
// counted as it is read, so it cannot pass the bound by not saying its
// length: served whole within the share, answered 413 past MaxBody, and
// refused with 503 while its tenant's share is held; another tenant is
// served meanwhile.
func TestRequestBytesUnknownLength(t *testing.T) {
	const maxBody = 128 << 10
	held := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(host.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		if r.URL.Query().Get("hold") != "" {
			held <- struct{}{}
			<-release
		}
		io.WriteString(w, strings.Repeat("x", int(n>>10)))
	}), host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}, MaxBody: maxBody, RequestBytes: 4 * maxBody}))
	t.Cleanup(srv.Close)
	post := func(token, query string, size int, chunked bool) (int, int) {
		t.Helper()
		var body io.Reader = strings.NewReader(strings.Repeat("a", size))
		if chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp"+query, body)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
		return resp.StatusCode, len(got)
	}
	if code, kib := post(bobToken, "", 100<<10, true); code != http.StatusOK || kib != 100 {
		t.Errorf("bob's chunked body of 100 KiB: %d, %d KiB read; want 200, all of it", code, kib)
	}
	if code, _ := post(bobToken, "", maxBody+1, true); code != http.StatusRequestEntityTooLarge {
		t.Errorf("bob's chunked body past MaxBody: %d; want 413", code)
	}
	// Bob's share is a quarter of 512 KiB, raised to MaxBody: one body of
	// 128 KiB held fills it.
	done := make(chan int)
	go func() {
		code, _ := post(bobToken, "?hold=1", maxBody, false)
		done <- code
	}()
	<-held
	begin := time.Now()
	if code, _ := post(bobToken, "", 1<<10, true); code != http.StatusServiceUnavailable {
		t.Errorf("bob's chunked body with his share held: %d; want 503", code)
	}
	if waited := time.Since(begin); waited < time.Second {
		t.Errorf("bob's chunked body refused after %v; want it to wait for room first (2 s)", waited)
	}
	if code, kib := post(aliceToken, "", 100<<10, true); code != http.StatusOK || kib != 100 {
		t.Errorf("alice's chunked body while bob's share is held: %d, %d KiB; want 200, all of it", code, kib)
	}
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("bob's held body: %d; want 200", code)
	}
	if code, kib := post(bobToken, "", 1<<10, true); code != http.StatusOK || kib != 1 {
		t.Errorf("bob's chunked body after his share is given back: %d, %d KiB; want 200", code, kib)
	}
}

// TestRequestBodiesRefusedCounted: a request the bound on request bodies
// refuses is counted in the host's metrics, by the bound it met: the
// total, or its subject's share (a review: nothing counted them, and an
// operator saw 503s at the proxy with no way to tell them from a
// draining replica's). Each guard's one held body of MaxBody fills its
// bound, and the next body waits 2 s and is refused.
func TestRequestBodiesRefusedCounted(t *testing.T) {
	const maxBody = 128 << 10
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	held := make(chan struct{})
	release := make(chan struct{})
	hold := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("hold") != "" {
			held <- struct{}{}
			<-release
		}
	})
	serve := func(g host.GuardOptions) string {
		g.MaxBody, g.Metrics = maxBody, f.h
		srv := httptest.NewServer(host.Guard(hold, g))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	post := func(url, token, query string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/mcp"+query, strings.NewReader(strings.Repeat("a", maxBody)))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	refusedOnce := func(url, token string) {
		t.Helper()
		done := make(chan int)
		go func() { done <- post(url, token, "?hold=1") }()
		<-held
		if code := post(url, token, ""); code != http.StatusServiceUnavailable {
			t.Errorf("a body past the bound: %d, want 503", code)
		}
		release <- struct{}{}
		<-done
	}
	// No tenants: the bound in all is one body.
	refusedOnce(serve(host.GuardOptions{RequestBytes: maxBody}), "")
	// Bob's share is a quarter of 4 bodies: one.
	refusedOnce(serve(host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}, RequestBytes: 4 * maxBody}), bobToken)

	rec := httptest.NewRecorder()
	f.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, series := range []string{
		`wasmtools_request_bodies_refused_total{reason="total"} 1`,
		`wasmtools_request_bodies_refused_total{reason="per_subject"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), series+"\n") {
			t.Errorf("no %s in the metrics:\n%s", series, regexp.MustCompile(`(?m)^wasmtools_request.*$`).FindAllString(rec.Body.String(), -1))
		}
	}
}

// TestRequestBodyHangUpNotCounted: a request whose client hung up while
// it waited for room under the bound on request bodies is not counted as
// refused: the metric counts the 503s clients were told (a review: a
// client gone during the wait counted as one, and an operator read it as
// a refusal).
func TestRequestBodyHangUpNotCounted(t *testing.T) {
	const maxBody = 128 << 10
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	held := make(chan struct{})
	release := make(chan struct{})
	g := host.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("hold") != "" {
			held <- struct{}{}
			<-release
		}
	}), host.GuardOptions{MaxBody: maxBody, Metrics: f.h, RequestBytes: maxBody})
	body := func() io.Reader { return strings.NewReader(strings.Repeat("a", maxBody)) }
	done := make(chan struct{})
	go func() {
		g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/mcp?hold=1", body()))
		close(done)
	}()
	<-held
	// The bound is full: this request waits, and its client is gone.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/mcp", body()).WithContext(ctx))
	release <- struct{}{}
	<-done

	rec := httptest.NewRecorder()
	f.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if series := regexp.MustCompile(`(?m)^wasmtools_request_bodies_refused_total\{.*\} [1-9].*$`).FindAllString(rec.Body.String(), -1); len(series) > 0 {
		t.Errorf("a request whose client hung up counted as refused: %s", series)
	}
}

// TestPublicPathBodiesHoldNoBudget: the bodies of requests to the paths
// served without a token (/healthz, /readyz, the operator's endpoints,
// which check their own credential, and the OAuth metadata) count
// against no one's share of the bound on request bodies. A red team
// (stop 72) found them counted as the anonymous tenant's: a client with
// no token sent chunked POSTs to /healthz and never their bodies, each
// reserving 64 KiB from before its first byte until the body timeout
// (30 s), and with only the shared token configured (no subjects: one
// budget for everyone) every token holder's request then waited 2 s and
// was refused 503, the call failing; with subjects, the shared token's
// holders (the anonymous pool) were. At the defaults that is 1,024 idle
// connections, or 16 that sent 2 MiB each, renewed every 30 s.
func TestPublicPathBodiesHoldNoBudget(t *testing.T) {
	const maxBody = 64 << 10
	const shared = "shared-token-0123456789"
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	// Each attacking request's step past the guard: its handler run
	// (served without the bound), or the server's "100 Continue" (the
	// guard reading its body, which it does only once it counted it).
	taken := make(chan struct{}, 16)
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		taken <- struct{}{}
		io.WriteString(w, "ok")
	})
	srv := httptest.NewServer(host.Guard(mux, host.GuardOptions{
		Token: shared, Public: []string{"/healthz"}, MaxBody: maxBody, RequestBytes: 4 * maxBody,
		// The attack holds for as long as a body may take: longer than
		// the call below is given.
		BodyTimeout: 5 * time.Minute,
	}))
	t.Cleanup(srv.Close)
	cs := connectHTTP(t, srv.URL, "", tenantTransport{token: shared})

	// Four POSTs to /healthz with no token, their bodies chunked and
	// never sent.
	for range 4 {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
		go func() {
			if status, _ := bufio.NewReader(c).ReadString('\n'); strings.HasPrefix(status, "HTTP/1.1 100") {
				taken <- struct{}{}
			}
		}()
	}
	for range 4 {
		<-taken
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count"})
	if err != nil || res.IsError {
		t.Fatalf("the shared token's call while clients with no token hold bodies to /healthz: %v %+v; want it served", err, res)
	}
}

// TestListenBodiesGiveBackTheirBytes: a 2026-07-28 subscriptions/listen
// stream, open until its client leaves, holds nothing of the bound on
// request bodies once its request has been read and parsed: what it
// keeps is counted against the listen streams' own bytes. A tenant
// review found a listen's body counted as long as its stream was open:
// with no subjects (only the shared token: one tenant for everyone), a
// client held the bound in all with listens padded to MaxBody (16 of 4
// MiB at the defaults), and every other request of the token waited 2 s
// and was refused 503. Here four padded listens fill the bound of four
// bodies, and the shared token's tools/call is served.
func TestListenBodiesGiveBackTheirBytes(t *testing.T) {
	const maxBody = 64 << 10
	const shared = "shared-token-0123456789"
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"counter.wasm":    testplugins.Example(t, "counter"),
		"everything.wasm": testplugins.Example(t, "everything"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, MaxBody: maxBody, RequestBytes: 4 * maxBody})
	for i := range 4 {
		first, _ := listenPadded(t, url, shared, []string{"test://template/1/data"}, maxBody)
		if !strings.Contains(first, "notifications/subscriptions/acknowledged") {
			t.Fatalf("padded listen %d: %q, want it acknowledged", i+1, first)
		}
	}
	cs := connectHTTP(t, url, "", tenantTransport{token: shared})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count"})
	if err != nil || res.IsError {
		t.Fatalf("the shared token's call while four listens padded to MaxBody are open: %v %+v; want it served", err, res)
	}
}
