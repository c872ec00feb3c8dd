// Package native is the benchmarks' baseline tool server: the tools of the
// counter and servlet plugins ("count" and "echo") written as native Go
// handlers on a go-sdk server, the way a Go developer would write them
// without wasmtools. Its handlers run in the server's process with no
// isolation between clients beyond what Go code gives.
package native

import (
	"context"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EchoInput is the echo tool's arguments, matching the servlet plugin's
// schema: {"text": string}, required.
type EchoInput struct {
	Text string `json:"text" jsonschema:"the text to return"`
}

// NewServer returns a go-sdk server with two tools: "count", which adds one
// to the calling session's counter and returns it (as the counter plugin
// does), and "echo", which returns its text argument (as the servlet
// plugin's echo does). It is safe for concurrent use.
func NewServer() *mcp.Server {
	return newServer(func(req *mcp.CallToolRequest) any { return req.Session })
}

// NewServerKeyed is NewServer for clients of protocol 2026-07-28 over
// stateless streamable HTTP, which have no session: "count" keeps a
// counter per value of the request's HTTP header, as a native server of
// that protocol keys its clients' state.
func NewServerKeyed(header string) *mcp.Server {
	return newServer(func(req *mcp.CallToolRequest) any {
		if req.Extra == nil || req.Extra.Header == nil {
			return ""
		}
		return req.Extra.Header.Get(header)
	})
}

// newServer makes the server, keeping count's counters per key(req).
func newServer(key func(*mcp.CallToolRequest) any) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "native", Version: "1"}, nil)
	var mu sync.Mutex
	counts := map[any]int64{}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "Adds one to this session's counter and returns it."},
		func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			k := key(req)
			mu.Lock()
			counts[k]++
			n := counts[k]
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strconv.FormatInt(n, 10)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Returns its text argument."},
		func(_ context.Context, _ *mcp.CallToolRequest, in EchoInput) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	return s
}
