package host_test

// Red-team tests of what operators watch: traces (stop 64; each failed
// before its fix).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// tracing turns spans on for the test, recorded in memory, sampled by
// sampler (nil: the SDK's default).
func tracing(t *testing.T, sampler sdktrace.Sampler) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
	if sampler != nil {
		opts = append(opts, sdktrace.WithSampler(sampler))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	telemetry.Use(tp)
	t.Cleanup(func() { telemetry.Use(nil); tp.Shutdown(context.Background()) })
	return rec
}

// spanBytes is what a span carries that a client could have chosen: its
// name, its attributes' values and its status description.
func spanBytes(s sdktrace.ReadOnlySpan) int {
	n := len(s.Name()) + len(s.Status().Description)
	for _, a := range s.Attributes() {
		n += len(a.Value.Emit())
	}
	return n
}

// TestSpanOfUnknownToolIsBounded: a client's tools/call of a tool that
// does not exist, with a name of 64 KiB, is a span whose name, attribute
// gen_ai.tool.name and status description ("unknown tool %q") each carry
// the whole name. The SDK's attribute length limit is unlimited by
// default, the span name is never cut, and the batch processor keeps up to
// 2048 spans in memory before export: one tenant's requests make the
// server hold (and export) gigabytes.
func TestSpanOfUnknownToolIsBounded(t *testing.T) {
	rec := tracing(t, nil)
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"hash.wasm": testplugins.Example(t, "hash")})
	cs := f.connect(t, "2025-11-25", nil)
	name := strings.Repeat("x", 1<<16) // four times the bound; 1 MiB took 40 s under -race
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name})
	if err == nil {
		t.Fatal("a call of an unknown tool succeeded")
	}
	var worst int
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "tools/call") {
			worst = max(worst, spanBytes(s))
		}
	}
	if worst == 0 {
		t.Fatal("no tools/call span recorded")
	}
	if worst > 16<<10 {
		t.Errorf("the tools/call span of an unknown tool carries %d bytes the client chose (name, attributes, status); want them bounded (16 KiB)", worst)
	}
}

// TestClientCannotForceSampling: the operator samples 1% of traces
// (OTEL_TRACES_SAMPLER=traceidratio, OTEL_TRACES_SAMPLER_ARG=0.01, not even
// parent-based), yet every request of a client that sends a traceparent
// whose trace ID it chose (low 64 bits zero) is sampled and exported: the
// request's span takes the client's trace ID, which the ratio sampler
// hashes. A tenant makes the server export every span of its requests.
// With WASMTOOLS_TRACE_CLIENTS=link (telemetry.ClientContextLink, since
// stop 64) a request span is a root of its own, linked to the client's:
// the operator's sampler alone decides.
func TestClientCannotForceSampling(t *testing.T) {
	rec := tracing(t, sdktrace.TraceIDRatioBased(0.01))
	if err := telemetry.SetClientContext(telemetry.ClientContextLink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { telemetry.SetClientContext("") })
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"hash.wasm": testplugins.Example(t, "hash")})
	cs := f.connect(t, "2025-11-25", nil)
	const n = 50
	for range n {
		var hi [8]byte
		rand.Read(hi[:])
		tp := "00-" + hex.EncodeToString(hi[:]) + "0000000000000000-00f067aa0ba902b7-01"
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hash", Arguments: map[string]any{"text": "a"}, Meta: mcp.Meta{"traceparent": tp}})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %v", err, res)
		}
	}
	sampled := 0
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "tools/call") && s.SpanContext().IsSampled() {
			sampled++
			if l := s.Links(); len(l) != 1 || !strings.HasSuffix(l[0].SpanContext.TraceID().String(), "0000000000000000") || s.Parent().IsValid() {
				t.Errorf("a sampled request span: parent %v, links %v; want a root linked to the client's span", s.Parent(), l)
			}
		}
	}
	if sampled > n/5 {
		t.Errorf("%d of %d requests sampled at a 1%% ratio: the client's chosen trace IDs decide the operator's sampling", sampled, n)
	}
	// Every request sampled: each span is a root, linked to the client's.
	rec = tracing(t, sdktrace.AlwaysSample())
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hash", Arguments: map[string]any{"text": "a"}, Meta: mcp.Meta{"traceparent": tp}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "tools/call") {
			if l := s.Links(); s.Parent().IsValid() || len(l) != 1 || l[0].SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !s.SpanContext().IsSampled() {
				t.Errorf("the request span: parent %v, links %v, sampled %v; want a sampled root linked to the client's span", s.Parent(), l, s.SpanContext().IsSampled())
			}
			return
		}
	}
	t.Error("no tools/call span")
}

// TestClientBaggageNotForwardedToToolBackends: a client's `_meta`
// baggage (W3C Baggage, whatever the client put in it) goes out in the
// `baggage` header of every HTTP request the plugin makes through its
// grant, a header the guest did not set and cannot remove (telemetry.Inject
// replaces the guest's). README promises `traceparent` to the tool's
// backend; a backend that reads baggage (tenant, user, feature flags) is
// told whatever any MCP client chose.
func TestClientBaggageNotForwardedToToolBackends(t *testing.T) {
	tracing(t, nil)
	got := make(chan string, 1)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Get("baggage"):
		default:
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(svc.Close)
	addr := strings.TrimPrefix(svc.URL, "http://")
	pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{AllowedHosts: []string{addr}, AllowPrivate: true})
	f := newFixture(t, nil, pol, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	cs := f.connect(t, "2025-11-25", nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "fetch", Arguments: map[string]any{"url": svc.URL + "/x"},
		Meta: mcp.Meta{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "tenant=admin,user.id=root"},
	})
	if err != nil || res.IsError {
		t.Fatalf("fetch: %v %v", err, res)
	}
	if b := <-got; b != "" {
		t.Errorf("the tool's backend got the client's baggage %q; want none (only traceparent crosses the sandbox)", b)
	}
}

// TestGuestURLQueryNotInSpans: the span of a plugin's HTTP request
// records only the URL's host ("a URL's path and query can hold
// secrets"; README: never in attributes), but a failed request ends the
// span with the *url.Error's text as its status description, and that
// text is the whole URL: `Get "http://host/path?api_key=…": …`.
func TestGuestURLQueryNotInSpans(t *testing.T) {
	rec := tracing(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() { // accept and hang up: the request fails
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{AllowedHosts: []string{addr}, AllowPrivate: true})
	f := newFixture(t, nil, pol, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	cs := f.connect(t, "2025-11-25", nil)
	const secret = "sk_live_SECRET123"
	cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"url": "http://" + addr + "/v1/charges?api_key=" + secret}})
	for _, s := range rec.Ended() {
		all := s.Name() + " " + s.Status().Description
		for _, a := range s.Attributes() {
			all += " " + a.Value.Emit()
		}
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				all += " " + a.Value.Emit()
			}
		}
		if strings.Contains(all, secret) || strings.Contains(all, "/v1/charges") {
			t.Errorf("span %q carries the plugin's URL path and query: status %q", s.Name(), s.Status().Description)
		}
	}
}
