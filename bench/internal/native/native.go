// Package native is the benchmarks' baseline tool server: the tools of the
// counter and servlet plugins ("count" and "echo") written as native Go
// handlers on a go-sdk server, the way a Go developer would write them
// without wasmtools. Its handlers run in the server's process with no
// isolation between clients beyond what Go code gives.
package native

import (
	"context"
	"crypto/rand"
	"strconv"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
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

// The session argument of NewServerHandle's tools, and the _meta key of
// their results that returns it: the names wasmtools uses (the bench
// checks that they agree with package host's).
const (
	SessionArgument = "wasmtools_session"
	SessionHeader   = "Wasmtools-Session"
	MetaSession     = "dev.wasmtools/session"
)

// CountHandleInput is count's arguments on NewServerHandle: the session
// handle only.
type CountHandleInput struct {
	Session string `json:"wasmtools_session,omitempty"`
}

// EchoHandleInput is echo's arguments on NewServerHandle: EchoInput and
// the session handle.
type EchoHandleInput struct {
	Text    string `json:"text" jsonschema:"the text to return"`
	Session string `json:"wasmtools_session,omitempty"`
}

// NewServerHandle is NewServer for clients of protocol 2026-07-28 over
// stateless streamable HTTP, keyed the way wasmtools keys them: every tool
// takes a SessionArgument string argument, annotated with x-mcp-header
// SessionHeader (SEP-2243, so that a go-sdk client mirrors it into the
// Mcp-Param-Wasmtools-Session header and the go-sdk server checks the two
// agree). A call without it, or with one this server did not mint, gets a
// new handle; every result returns the handle in _meta[MetaSession], and
// "count" keeps its counter per handle. It is what the go-sdk charges for
// a handle's round trip, with none of wasmtools' own work (its handles
// are random strings, not signed, and never expire).
func NewServerHandle() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "native", Version: "1"}, nil)
	var mu sync.Mutex
	counts := map[string]int64{}
	// session returns the known handle h, or a new one, and adds d to its
	// counter.
	session := func(h string, d int64) (string, int64) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := counts[h]; !ok || h == "" {
			h = rand.Text()
		}
		counts[h] += d
		return h, counts[h]
	}
	result := func(h, text string) *mcp.CallToolResult {
		return &mcp.CallToolResult{
			Content: []mcp.Content{&mcp.TextContent{Text: text}},
			Meta:    mcp.Meta{MetaSession: h},
		}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "Adds one to this session's counter and returns it.", InputSchema: handleSchema[CountHandleInput]()},
		func(_ context.Context, _ *mcp.CallToolRequest, in CountHandleInput) (*mcp.CallToolResult, any, error) {
			h, n := session(in.Session, 1)
			return result(h, strconv.FormatInt(n, 10)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Returns its text argument.", InputSchema: handleSchema[EchoHandleInput]()},
		func(_ context.Context, _ *mcp.CallToolRequest, in EchoHandleInput) (*mcp.CallToolResult, any, error) {
			h, _ := session(in.Session, 0)
			return result(h, in.Text), nil, nil
		})
	return s
}

// handleSchema is the input schema inferred from T, its SessionArgument
// property annotated with x-mcp-header SessionHeader.
func handleSchema[T any]() *jsonschema.Schema {
	schema, err := jsonschema.For[T](nil)
	if err != nil {
		panic(err)
	}
	p := schema.Properties[SessionArgument]
	p.Description = "Session handle. Pass the value returned by an earlier call to keep working with the same state; omit it to start a new session."
	p.Extra = map[string]any{"x-mcp-header": SessionHeader}
	return schema
}
