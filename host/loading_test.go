package host_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestCallWhileLoadingSaysSo: a call of a tool not served yet, whose wait
// for the first load (LoadWait) ends before the load does, is told the
// plugins are still loading, not only that the tool is unknown: on a cold
// cache, a first call of an example plugin's tool met a bare "unknown
// tool" while the plugin was compiling.
func TestCallWhileLoadingSaysSo(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	reloader := plugins.NewReloader(rt, plugins.ReloaderOptions{})
	t.Cleanup(func() { reloader.Close(ctx) })
	f := &fixture{log: &syncBuffer{}, rt: rt}
	// Never loaded: the call's wait ends with LoadWait.
	f.h = host.New(reloader, &host.Options{Logger: newTestLogger(f.log), Loaded: make(chan struct{}), LoadWait: time.Second})
	t.Cleanup(func() { f.h.Close(ctx) })
	cs := f.connect(t, "", nil)
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "hash", Arguments: map[string]any{"text": "abc"}})
	if err == nil || !strings.Contains(err.Error(), `unknown tool "hash"`) || !strings.Contains(err.Error(), "still loading") {
		t.Errorf("call during the first load: %v; want unknown tool, the plugins still loading", err)
	}
}
