package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/bench/internal/native"
)

// httpProtocol is the revision the HTTP benchmarks negotiate: the last one
// with sessions (Mcp-Session-Id), so that a wasmtools session keeps its
// warm instance across calls. Over 2026-07-28 (sessionless) each request
// would get a fresh instance unless the operator sets a client key header.
const httpProtocol = "2025-11-25"

// BenchmarkWarmCall measures one tool call through the full MCP stack
// (issue 7, item 2): go-sdk client, transport, go-sdk server, tool,
// result, on a session that has already made a call (its instance is warm).
// The transports are the in-memory pair (inmemory) and streamable HTTP on
// 127.0.0.1 (http, protocol 2025-11-25). The tools are the small plugin's
// count and the Go plugin's echo with a 100-byte input.
//
// The baseline, native, is the same tool written as a native Go handler
// (mcp.AddTool) on a go-sdk server with the same transport; wasmtools is
// the plugin served by wasmtools, which also validates the arguments
// against the plugin's schema, as the native handler's typed input does.
// The report gives the throughput ratio native ns/op ÷ wasmtools ns/op;
// issue 7's goal is at least 0.8.
func BenchmarkWarmCall(b *testing.B) {
	ctx := context.Background()
	nsrv := native.NewServer()
	for _, p := range benchPlugins {
		h := newHost(b, p.path(b))
		servers := []struct {
			name string
			srv  *mcp.Server
			http http.Handler
		}{
			{"native", nsrv, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return nsrv }, nil)},
			{"wasmtools", h.Server(), h.HTTPHandler()},
		}
		for _, s := range servers {
			b.Run("inmemory/"+p.name+"/"+s.name, func(b *testing.B) {
				cs, _, err := connectInMemory(ctx, s.srv)
				if err != nil {
					b.Fatal(err)
				}
				defer cs.Close()
				warmCalls(ctx, b, cs, p)
			})
		}
		for _, s := range servers {
			b.Run("http/"+p.name+"/"+s.name, func(b *testing.B) {
				srv := httptest.NewServer(s.http) // 127.0.0.1
				defer srv.Close()
				cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, &mcp.ClientSessionOptions{ProtocolVersion: httpProtocol})
				if err != nil {
					b.Fatal(err)
				}
				defer cs.Close()
				warmCalls(ctx, b, cs, p)
			})
		}
	}
}

// warmCalls makes one untimed call to warm the session, then times calls.
func warmCalls(ctx context.Context, b *testing.B, cs *mcp.ClientSession, p plugin) {
	if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
			b.Fatal(err)
		}
	}
}
