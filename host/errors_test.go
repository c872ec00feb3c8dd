package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// statusRecorder records the HTTP status of each POST (the last is the
// call's: 2025-11-25 requests have no Mcp-Method header to tell).
type statusRecorder struct {
	mu       sync.Mutex
	statuses []int
}

func (r *statusRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost {
		r.mu.Lock()
		r.statuses = append(r.statuses, resp.StatusCode)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *statusRecorder) last() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.statuses) == 0 {
		return 0
	}
	return r.statuses[len(r.statuses)-1]
}

// rpcError returns the JSON-RPC error err carries, failing the test when
// there is none.
func rpcError(t *testing.T, what string, err error) *jsonrpc.Error {
	t.Helper()
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		t.Fatalf("%s: %v; want a JSON-RPC error", what, err)
	}
	return je
}

// A tool that declares a client capability is refused, before its guest
// runs, with MissingRequiredClientCapability (-32021) naming it, and
// HTTP 400 in the 2026-07-28 era; a client that declares it gets the
// result. Both eras, over HTTP.
func TestMissingCapability(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	sampling := &mcp.ClientOptions{CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
		return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "hi"}}, nil
	}}
	for _, era := range []struct {
		protocol string
		status   int // of the refusal
	}{
		{"2026-07-28", http.StatusBadRequest},
		{"2025-11-25", http.StatusOK}, // an error inside the SSE response
	} {
		t.Run(era.protocol, func(t *testing.T) {
			rec := &statusRecorder{}
			without := connectHTTPEra(t, url, era.protocol, nil, rec)
			if v := without.InitializeResult().ProtocolVersion; v != era.protocol {
				t.Fatalf("negotiated %s, want %s", v, era.protocol)
			}
			_, err := without.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_missing_capability", Arguments: map[string]any{}})
			je := rpcError(t, "call without sampling", err)
			if je.Code != mcp.CodeMissingRequiredClientCapabilities {
				t.Errorf("code = %d, want %d", je.Code, mcp.CodeMissingRequiredClientCapabilities)
			}
			var data mcp.MissingRequiredClientCapabilityData
			if err := json.Unmarshal(je.Data, &data); err != nil || data.RequiredCapabilities == nil || data.RequiredCapabilities.Sampling == nil {
				t.Errorf("data = %s (%v); want requiredCapabilities.sampling", je.Data, err)
			}
			if got := rec.last(); got != era.status {
				t.Errorf("HTTP status = %d, want %d", got, era.status)
			}
			with := connectHTTPEra(t, url, era.protocol, sampling, http.DefaultTransport)
			if got := firstText(call(t, with, "test_missing_capability", nil)); got != "Client declared the sampling capability; tool executed." {
				t.Errorf("call with sampling = %q", got)
			}
		})
	}
}

// The other refusals carry codes a client can branch on, with the reason
// in data: an unknown tool is -32602 (Invalid params), a full queue
// CodeBusy, a closing server CodeShuttingDown. Both eras, over HTTP.
func TestRefusalCodes(t *testing.T) {
	f := newFixture(t, &host.Options{QueueLimit: 1}, sandbox.NewPolicy().WithCallTimeout(time.Minute), map[string]string{"loop.wat.wasm": testplugins.Test(t, "loop")})
	url := serveHTTP(t, f)
	for _, protocol := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(protocol, func(t *testing.T) {
			// 2026-07-28 has no sessions: the operator's client header
			// would key both calls together, but the loop plugin keeps
			// state, so a handle does too; the legacy session keys them.
			cs := connectHTTPEra(t, url, protocol, nil, http.DefaultTransport)
			_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
			if je := rpcError(t, "unknown tool", err); je.Code != jsonrpc.CodeInvalidParams {
				t.Errorf("unknown tool: code %d, want %d", je.Code, jsonrpc.CodeInvalidParams)
			}
			if protocol != "2025-11-25" {
				return // the queue is per client: see the session below
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			running := make(chan struct{})
			go func() {
				close(running)
				cs.CallTool(ctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
			}()
			<-running
			eventually(t, "the first call to hold its instance", func() bool { return f.h.BusyInstances() == 1 })
			_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
			je := rpcError(t, "second call with queue limit 1", err)
			var data map[string]any
			json.Unmarshal(je.Data, &data)
			if je.Code != host.CodeBusy || data["reason"] != "busy" || data["retry"] != true {
				t.Errorf("busy: code %d data %s; want %d, reason busy, retry", je.Code, je.Data, host.CodeBusy)
			}
			cancel()
			eventually(t, "the spinning call to stop", func() bool { return f.h.BusyInstances() == 0 })
		})
	}
	t.Run("shutting down", func(t *testing.T) {
		cs := connectHTTPEra(t, url, "2026-07-28", nil, http.DefaultTransport)
		if err := f.h.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
		if je := rpcError(t, "call after Close", err); je.Code != host.CodeShuttingDown {
			t.Errorf("after Close: code %d (%s), want %d", je.Code, je.Message, host.CodeShuttingDown)
		}
	})
}
