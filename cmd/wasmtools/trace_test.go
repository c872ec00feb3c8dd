package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// jaegerInstall is how scripts/deps.sh installs Jaeger.
const jaegerInstall = "scripts/install-jaeger.sh"

// TestTraces runs a real Jaeger (all in one, in memory, OTLP over HTTP on
// loopback), wasmtools over stdio and over HTTP exporting to it, and a
// loopback service a plugin's granted HTTP request reaches. Each call
// carries the client's trace context (`_meta` over stdio, the traceparent
// header and `_meta` over HTTP); Jaeger's query API must then hold one
// trace per call: the request's span as a child of the client's, the slot
// wait and the guest's run under it, and the plugin's HTTP request as the
// parent the service was told of in its traceparent header.
func TestTraces(t *testing.T) {
	jaeger := startJaeger(t)

	var mu sync.Mutex
	received := map[string]string{} // trace ID → the traceparent the service got
	service := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tp := r.Header.Get("traceparent")
		if parts := strings.Split(tp, "-"); len(parts) == 4 {
			mu.Lock()
			received[parts[1]] = tp
			mu.Unlock()
		}
		fmt.Fprint(w, "hello from the service")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serviceAddr := ln.Addr().String()
	go service.Serve(ln)
	t.Cleanup(func() { service.Close() })

	dir := testplugins.Folder(t, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("[plugins.grants]\nallowed_hosts = [%q]\nallow_private_networks = true\n", serviceAddr)), 0o644)
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + jaeger.otlp,
		"OTEL_BSP_SCHEDULE_DELAY=100", // milliseconds: spans reach Jaeger at once
	}
	fetch := map[string]any{"url": "http://" + serviceAddr + "/hello"}

	type call struct {
		name    string
		traceID string
		spanID  string
	}
	var calls []call

	// stdio: the trace context comes in `_meta`.
	{
		var stderr lockedBuffer
		cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--config", cfg, dir)
		cmd.Env = append(append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "OTEL_SERVICE_NAME=wasmtools-stdio"), env...)
		cmd.Stderr = &stderr
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, stderr.String())
		}
		if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded", "tracing on")) {
			t.Fatalf("not loaded, or tracing not on:\n%s", stderr.String())
		}
		tid, sid := newTraceIDs()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{
			Name: "fetch", Arguments: fetch,
			Meta: mcp.Meta{"traceparent": "00-" + tid + "-" + sid + "-01"},
		})
		checkFetch(t, "stdio", res, err)
		calls = append(calls, call{"stdio, _meta", tid, sid})
		cs.Close() // the server flushes its spans as it exits
	}

	// HTTP: the traceparent header, then `_meta`.
	{
		addr := freeAddr(t)
		var stderr lockedBuffer
		cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--config", cfg, "--http", addr, dir)
		cmd.Env = append(append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "OTEL_SERVICE_NAME=wasmtools-http"), env...)
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded", "tracing on")) {
			t.Fatalf("not loaded, or tracing not on:\n%s", stderr.String())
		}
		tid, sid := newTraceIDs()
		tr := &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: traceHeader{"00-" + tid + "-" + sid + "-01"}}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fetch", Arguments: fetch})
		checkFetch(t, "HTTP header", res, err)
		calls = append(calls, call{"HTTP, header", tid, sid})
		cs.Close()

		tid, sid = newTraceIDs()
		cs, err = mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{
			Name: "fetch", Arguments: fetch,
			Meta: mcp.Meta{"traceparent": "00-" + tid + "-" + sid + "-01"},
		})
		checkFetch(t, "HTTP _meta", res, err)
		calls = append(calls, call{"HTTP, _meta", tid, sid})
		cs.Close()
	}

	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			spans := jaeger.waitTrace(t, c.traceID, func(s []jaegerSpan) bool { return findSpan(s, "GET") != nil && findSpan(s, "tools/call fetch") != nil })
			req := findSpan(spans, "tools/call fetch")
			if req == nil {
				t.Fatalf("no tools/call span in the trace: %v", spanNames(spans))
			}
			if got := req.parent(); got != c.spanID {
				t.Errorf("the tools/call span's parent is %q, want the client's span %s", got, c.spanID)
			}
			for k, want := range map[string]string{"mcp.method.name": "tools/call", "gen_ai.tool.name": "fetch", "gen_ai.operation.name": "execute_tool"} {
				if got := req.tag(k); got != want {
					t.Errorf("tools/call span: %s = %q, want %q", k, got, want)
				}
			}
			acquire, guest, get := findSpan(spans, "wasmtools.acquire"), findSpan(spans, "wasmtools.guest fetch"), findSpan(spans, "GET")
			if acquire == nil || guest == nil || get == nil {
				t.Fatalf("the trace lacks the slot wait, the guest's run or its HTTP request: %v", spanNames(spans))
			}
			if acquire.parent() != req.SpanID || guest.parent() != req.SpanID {
				t.Errorf("the slot wait and the guest's run are not children of the request: %s, %s; request %s", acquire.parent(), guest.parent(), req.SpanID)
			}
			if get.parent() != guest.SpanID {
				t.Errorf("the plugin's HTTP request is not a child of the guest's run: %s, want %s", get.parent(), guest.SpanID)
			}
			mu.Lock()
			tp := received[c.traceID]
			mu.Unlock()
			if want := "00-" + c.traceID + "-" + get.SpanID + "-01"; tp != want {
				t.Errorf("the service got traceparent %q, want %q (the HTTP request's span)", tp, want)
			}
			for _, s := range spans {
				for _, tag := range s.Tags {
					if strings.Contains(fmt.Sprint(tag.Value), "/hello") {
						t.Errorf("span %s records the guest's URL path in %s", s.OperationName, tag.Key)
					}
				}
			}
		})
	}
}

func checkFetch(t *testing.T, what string, res *mcp.CallToolResult, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "200 hello from the service") {
		t.Fatalf("%s: fetch answered %+v", what, res.Content)
	}
}

// traceHeader adds a traceparent header to every request.
type traceHeader struct{ traceparent string }

func (h traceHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("traceparent", h.traceparent)
	return http.DefaultTransport.RoundTrip(r)
}

func newTraceIDs() (traceID, spanID string) {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
}

type jaegerProc struct{ otlp, query string }

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

func (s *jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

func (s *jaegerSpan) tag(k string) string {
	for _, t := range s.Tags {
		if t.Key == k {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

func findSpan(spans []jaegerSpan, name string) *jaegerSpan {
	for i := range spans {
		if spans[i].OperationName == name {
			return &spans[i]
		}
	}
	return nil
}

func spanNames(spans []jaegerSpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.OperationName)
	}
	return out
}

// startJaeger runs Jaeger v2 all in one, in memory, every endpoint on a
// free loopback port, until the test ends; ready when its health check
// says so.
func startJaeger(t *testing.T) *jaegerProc {
	t.Helper()
	bin := sourcestest.GoTool(t, "jaeger", jaegerInstall)
	j := &jaegerProc{otlp: freeAddr(t), query: freeAddr(t)}
	health, grpc := freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %s
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, health, j.query, grpc, j.otlp)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	os.WriteFile(path, []byte(cfg), 0o644)
	var logs lockedBuffer
	cmd := exec.Command(bin, "--config", path)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	// Its log says when it is up; the health endpoint confirms.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + health + "/status")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		select {
		case <-exited:
			t.Fatalf("jaeger exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready: %v\n%s", err, logs.String())
		}
		logs.waitFor(time.Now().Add(time.Second), func(string) bool { return false })
	}
}

// waitTrace reads trace id from Jaeger's query API until ok holds of its
// spans. Jaeger has no event to wait on: spans arrive in batches (every
// 100 ms here), so it asks again each half second, for up to a minute.
func (j *jaegerProc) waitTrace(t *testing.T, id string, ok func([]jaegerSpan) bool) []jaegerSpan {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var spans []jaegerSpan
	for {
		spans = nil
		resp, err := http.Get("http://" + j.query + "/api/traces/" + id)
		if err == nil {
			var body struct {
				Data []struct {
					Spans []jaegerSpan `json:"spans"`
				} `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			for _, d := range body.Data {
				spans = append(spans, d.Spans...)
			}
			if ok(spans) {
				return spans
			}
		}
		if time.Now().After(deadline) {
			return spans
		}
		time.Sleep(500 * time.Millisecond)
	}
}
