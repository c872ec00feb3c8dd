package host_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// headerTransport adds a header to every request.
type headerTransport struct{ name, value string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return http.DefaultTransport.RoundTrip(r)
}

// serveHTTP serves the fixture's host on a loopback listener.
func serveHTTP(t *testing.T, f *fixture) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	mux.Handle("/metrics", f.h.MetricsHandler())
	srv := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(srv.Close)
	return srv.URL
}

func connectHTTP(t *testing.T, url, protocol string, rt http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	return connectHTTPEra(t, url, protocol, nil, rt)
}

// connectHTTPEra connects a go-sdk client with options copts, negotiating
// protocol ("" for the client's default), its requests through rt (nil
// for the default transport).
func connectHTTPEra(t *testing.T, url, protocol string, copts *mcp.ClientOptions, rt http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
	if rt != nil {
		tr.HTTPClient = &http.Client{Transport: rt}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestHTTPStatefulSessions(t *testing.T) {
	// The timeout must outlast a's two calls on a loaded machine (CI's
	// -race run): b is idle through them.
	f := newFixture(t, &host.Options{SessionTimeout: 3 * time.Second}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	a, b := connectHTTP(t, url, "2025-11-25", nil), connectHTTP(t, url, "2025-11-25", nil)
	if a.ID() == "" || a.ID() == b.ID() {
		t.Fatalf("session IDs %q and %q", a.ID(), b.ID())
	}
	for _, want := range []string{"1", "2"} {
		if got := text(call(t, a, "count", nil)); got != want {
			t.Errorf("a: count = %s, want %s", got, want)
		}
	}
	if got := text(call(t, b, "count", nil)); got != "1" {
		t.Errorf("b: count = %s, want 1", got)
	}
	a.Close() // DELETE
	// (b's may be gone by then too, if its timeout passed meanwhile.)
	eventually(t, "a's instance freed on DELETE", func() bool { return f.h.LiveInstances() <= 1 })
	// b sends nothing more: the idle timeout ends its session.
	eventually(t, "b's instance freed on idle timeout", func() bool { return f.h.LiveInstances() == 0 })
}

func TestHTTPSessionless(t *testing.T) {
	f := newFixture(t, &host.Options{ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)

	plain := connectHTTP(t, url, "", nil)
	if v := plain.InitializeResult().ProtocolVersion; v < "2026-07-28" {
		t.Fatalf("negotiated %s; want the sessionless era on the same endpoint", v)
	}
	// Without the header, each call that passes no session handle gets a
	// new one (handles_test.go has the rest).
	for range 2 {
		if res := call(t, plain, "count", nil); firstText(res) != "1" || handleOf(res) == "" {
			t.Errorf("no client key: count = %s, want 1 on a new handle", text(res))
		}
	}

	alice := connectHTTP(t, url, "", headerTransport{"X-Client", "alice"})
	alice2 := connectHTTP(t, url, "", headerTransport{"X-Client", "alice"})
	bob := connectHTTP(t, url, "", headerTransport{"X-Client", "bob"})
	live := f.h.LiveInstances()
	var got []string
	for _, cs := range []*mcp.ClientSession{alice, alice2, bob, alice} {
		res := call(t, cs, "count", nil)
		if handleOf(res) != "" {
			t.Errorf("a client keyed by the operator's header got a session handle")
		}
		got = append(got, text(res))
	}
	if strings.Join(got, ",") != "1,2,1,3" {
		t.Errorf("counts = %v; want 1,2,1,3 (alice's key shared, bob's own)", got)
	}
	if n := f.h.LiveInstances() - live; n != 2 {
		t.Errorf("%d instances made for two client keys", n)
	}
	// An older client on the same endpoint still gets a session.
	old := connectHTTP(t, url, "2025-11-25", nil)
	if old.ID() == "" {
		t.Error("a 2025-11-25 client got no session")
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"trap.wasm":    testplugins.Test(t, "trap"),
	})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "2025-11-25", nil)
	call(t, cs, "count", nil)
	call(t, cs, "boom", nil)
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`wasmtools_instances_live{plugin="counter"} 1`,
		`wasmtools_instances_created_total{plugin="trap"} 1`,
		`wasmtools_instance_resets_total{plugin="trap",reason="trap"} 1`,
		`wasmtools_calls_total{outcome="ok",plugin="counter"} 1`,
		`wasmtools_calls_total{outcome="tool_error",plugin="trap"} 1`,
		`wasmtools_call_duration_seconds_count{plugin="counter"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
