package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestHandlesSurviveClientCache: two go-sdk v1.8.0 clients (2026-07-28)
// connect while the server is still loading (a spinning plugin holds the
// first load), keep state with their session handles, and call with them
// across a hot reload of the plugin. A client that has not listed the
// tools since a list_changed does not know the session property's
// x-mcp-header and sends the handle without its Mcp-Param header; the
// server derives the header from the argument instead of refusing the
// call with HTTP 400.
func TestHandlesSurviveClientCache(t *testing.T) {
	dir := t.TempDir()
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	os.WriteFile(filepath.Join(dir, "counter.wasm"), counter, 0o644)
	os.WriteFile(filepath.Join(dir, "spin.wasm"), testplugins.Bytes(t, testplugins.Test(t, "hostilestart")), 0o644)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		run(ctx, []string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--derive-session-header", "--http", addr, dir}, lookup(nil), strings.NewReader(""), &bytes.Buffer{}, stderr)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("serving MCP over streamable HTTP")) {
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	url := "http://" + addr
	connect := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	// Both connect during the load (the spinning plugin is not in yet).
	c1, c2 := connect(), connect()
	if strings.Contains(stderr.String(), `msg="plugins loaded"`) {
		t.Fatal("the load ended before the clients connected")
	}
	count := func(cs *mcp.ClientSession, handle string) (string, string) {
		t.Helper()
		args := map[string]any{}
		if handle != "" {
			args[host.SessionArgument] = handle
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: args})
		if err != nil {
			t.Fatalf("count with handle %q: %v\n%s", handle, err, stderr.String())
		}
		if res.IsError {
			t.Fatalf("count with handle %q: error %v", handle, res.Content)
		}
		h, _ := res.Meta[host.MetaSession].(string)
		return res.Content[0].(*mcp.TextContent).Text, h
	}
	n1, h1 := count(c1, "")
	n2, h2 := count(c2, "")
	if n1 != "1" || n2 != "1" || h1 == "" || h2 == "" || h1 == h2 {
		t.Fatalf("first counts %s %s, handles %q %q", n1, n2, h1, h2)
	}
	// Neither client has listed the tools: the handle goes without its
	// header.
	if n, _ := count(c1, h1); n != "2" {
		t.Errorf("c1 second count = %s, want 2", n)
	}
	if n, _ := count(c2, h2); n != "2" {
		t.Errorf("c2 second count = %s, want 2", n)
	}
	// c2 lists the tools (the header is sent from then on), c1 does not.
	if _, err := c2.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	// A hot reload of the plugin (new bytes): both go on with their
	// handles, their state kept or its reset said in _meta.
	os.WriteFile(filepath.Join(dir, ".counter.tmp"), append(bytes.Clone(counter), 0, 5, 3, 'n', 'e', 'w', '1'), 0o644)
	os.Rename(filepath.Join(dir, ".counter.tmp"), filepath.Join(dir, "counter.wasm"))
	if !stderr.waitFor(time.Now().Add(time.Minute), func(s string) bool { return strings.Count(s, `msg="plugin loaded" plugin=counter`) >= 2 }) {
		t.Fatalf("no reload:\n%s", stderr.String())
	}
	for i, c := range []struct {
		cs *mcp.ClientSession
		h  string
	}{{c1, h1}, {c2, h2}} {
		n, h := count(c.cs, c.h)
		if n == "" || h != c.h {
			t.Errorf("client %d after the reload: count %q, handle %q (want its own %q)", i+1, n, h, c.h)
		}
	}
}

// TestHandlesWithoutHeaderBehindHAProxy: behind the project's HAProxy
// configuration (three replicas, a state store), two 2026-07-28 go-sdk
// clients that never list the tools (as after a list_changed dropped
// their cache) send their handles without the Mcp-Param header: HAProxy
// cannot route on it, so each call may reach any replica, which derives
// the header, takes the session over from the store, and keeps every note.
func TestHandlesWithoutHeaderBehindHAProxy(t *testing.T) {
	rs := newReplicaSet(t)
	ctx := context.Background()
	var clients []*mcpClient
	for i := range 2 {
		tr := &mcp.StreamableClientTransport{Endpoint: rs.proxy, HTTPClient: rs.client}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		clients = append(clients, &mcpClient{n: i, modern: true, cs: cs})
	}
	for range 4 {
		for _, c := range clients {
			if err := c.addNote(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range clients {
		if c.handle == "" {
			t.Fatalf("client %d got no handle", c.n)
		}
		if err := c.checkNotes(ctx); err != nil {
			t.Error(err)
		}
	}
}
