package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// hostABIClient is a client that answers every question "accept", with
// confirm=true, and collects progress.
type hostABIClient struct {
	mu         sync.Mutex
	progress   []float64
	asked      int
	progressed chan struct{} // signalled (without blocking) on each progress notification
}

func (c *hostABIClient) options() *mcp.ClientOptions {
	c.progressed = make(chan struct{}, 1)
	return &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c.mu.Lock()
			c.asked++
			c.mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true, "reason": "test"}}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, r.Params.Progress)
			c.mu.Unlock()
			select {
			case c.progressed <- struct{}{}:
			default:
			}
		},
	}
}

// exercise runs the longtask and confirm examples through cs.
func (c *hostABIClient) exercise(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "primes", Arguments: map[string]any{"below": 100000, "steps": 4}, Meta: mcp.Meta{"progressToken": "p1"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "9592 primes below 100000" {
		t.Fatalf("primes: %v %+v", err, res)
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		n := len(c.progress)
		last := 0.0
		if n > 0 {
			last = c.progress[n-1]
		}
		c.mu.Unlock()
		if last == 100000 {
			break
		}
		select {
		case <-c.progressed:
		case <-deadline.C:
			t.Fatalf("progress: %d notifications, last %v", n, last)
		}
	}
	callText(t, cs, "add", map[string]any{"item": "x"})
	if got := callText(t, cs, "delete", map[string]any{"item": "x"}); got != `deleted "x"` {
		t.Errorf("delete: %q", got)
	}
	if c.asked != 1 {
		t.Errorf("asked %d questions, want 1", c.asked)
	}
}

func hostABIFolder(t *testing.T) string {
	return testplugins.Folder(t, map[string]string{
		"longtask.wasm": testplugins.Example(t, "longtask"),
		"confirm.wasm":  testplugins.Example(t, "confirm"),
	})
}

func TestHostABIOverStdio(t *testing.T) {
	dir := hostABIFolder(t)
	records := filepath.Join(t.TempDir(), "records.jsonl")
	c := &hostABIClient{}
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--record-log", records, dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, c.options()).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr.String())
		}
	}()
	c.exercise(t, cs)
	cs.Close()
	b, err := os.ReadFile(records)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], `"records":[{"namespace":"dev.wasmtools.examples/confirm","data":{"deleted":"x","reason":"test"}}]`) {
		t.Errorf("record log:\n%s", b)
	}
}

func TestHostABIOverHTTP(t *testing.T) {
	dir := hostABIFolder(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr lockedBuffer
	go run(ctx, []string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr, "--client-header", "X-Client", dir}, nil, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("serving MCP over streamable HTTP")) {
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	for _, proto := range []string{"2025-11-25", ""} {
		t.Run("protocol="+proto, func(t *testing.T) {
			c := &hostABIClient{}
			tr := &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: clientHeader("abi-" + proto)}}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, c.options()).Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: proto})
			if err != nil {
				t.Fatalf("connect: %v\n%s", err, stderr.String())
			}
			defer cs.Close()
			c.exercise(t, cs)
		})
	}
}
