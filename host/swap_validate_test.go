package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// hostileaskRequiring builds hostileask with every tool's input schema
// requiring a property "must" (wat2wasm, as make testplugins does).
func hostileaskRequiring(t *testing.T) []byte {
	t.Helper()
	wat2wasm, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Skip("wat2wasm not found")
	}
	src := testplugins.Bytes(t, filepath.Join(testplugins.Root(), "internal", "testplugins", "src", "hostileask", "hostileask.wat"))
	old := []byte(`(data (i32.const 128) "\",\"inputSchema\":{\"type\":\"object\"}}")`)
	nu := []byte(`(data (i32.const 128) "\",\"inputSchema\":{\"type\":\"object\",\"required\":[\"must\"]}}")`)
	if !bytes.Contains(src, old) {
		t.Fatal("hostileask.wat changed")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "a.wat"), filepath.Join(dir, "a.wasm")
	os.WriteFile(in, bytes.Replace(src, old, nu, 1), 0o644)
	if b, err := exec.Command(wat2wasm, in, "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm: %v %s", err, b)
	}
	return testplugins.Bytes(t, out)
}

// A call queued behind its session's call in flight, validated
// against v1's input schema, is retargeted to v2 after a swap
// (Host.acquire) and run there without its arguments being validated
// against v2's schema: v2's guest got arguments its own schema refuses
// (until stop 64: a red team). It is answered as a call whose arguments
// are not valid.
func TestRetargetedCallIsValidatedAgainstNewSchema(t *testing.T) {
	v1 := testplugins.Bytes(t, testplugins.Test(t, "hostileask"))
	f := newReloadFixture(t, map[string][]byte{"hostileask.wasm": v1})
	var asked atomic.Int32
	first := make(chan struct{})
	release := make(chan struct{})
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		if asked.Add(1) == 1 {
			close(first)
			<-release
		}
		return accept("ann"), nil
	}})
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_plain", Arguments: map[string]any{}})
	<-first // ask_plain holds the session's instance
	queued := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_plain", Arguments: map[string]any{}})
		if err != nil {
			t.Error(err)
		}
		queued <- res
	}()
	eventually(t, "the second call queued for the instance", func() bool { return f.h.QueuedCalls() == 1 })
	f.deploy(t, "hostileask.wasm", hostileaskRequiring(t))
	if tool, _ := f.r.Catalogue().Tool("ask_plain"); tool.ValidateArguments(json.RawMessage(`{}`)) == nil {
		t.Fatal("v2 accepts {}")
	}
	close(release)
	res := <-queued
	if res == nil || !res.IsError || !strings.Contains(text(res), "new version refuses the arguments") {
		t.Errorf("the queued call's result: %v, want refused as its arguments not valid for the new version", res)
	}
	if asked.Load() > 1 || (res != nil && strings.Contains(text(res), "ann")) {
		t.Fatalf("the queued call ran on v2 with arguments v2's schema refuses ({} without \"must\"): v2's guest ran (questions asked %d), result %q, _meta %v", asked.Load(), text(res), res.Meta)
	}
}
