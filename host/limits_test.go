package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

func TestEvictionAndCapacity(t *testing.T) {
	f := newFixture(t, &host.Options{MaxInstances: 2}, sandbox.NewPolicy(), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"loop.wasm":    testplugins.Test(t, "loop"),
	})
	a, b, c := f.connect(t, "", nil), f.connect(t, "", nil), f.connect(t, "", nil)
	call(t, a, "count", nil)
	call(t, a, "count", nil)
	call(t, b, "count", nil)
	// c's first call needs room: a's instance is the least recently used.
	if got := text(call(t, c, "count", nil)); got != "1" {
		t.Fatalf("c: count = %s", got)
	}
	if n := f.h.LiveInstances(); n != 2 {
		t.Errorf("live = %d, want 2", n)
	}
	res := call(t, a, "count", nil) // evicts b's, the least recently used now
	if text(res) != "1" {
		t.Errorf("a after eviction: count = %s, want 1", text(res))
	}
	if reset, _ := res.Meta[host.MetaStateReset].(map[string]any); reset["reason"] != "evicted" {
		t.Errorf("a after eviction: _meta = %v, want stateReset evicted", res.Meta)
	}
	if got := text(call(t, c, "count", nil)); got != "2" {
		t.Errorf("c kept its instance: count = %s, want 2", got)
	}

	// With both instances busy, nothing can be evicted: refuse at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, cs := range []*mcp.ClientSession{a, b} {
		wg.Go(func() { cs.CallTool(ctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}}) })
	}
	eventually(t, "two spinning calls", func() bool {
		return strings.Count(f.log.String(), `msg="instance created" session`) >= 5 && strings.Count(f.log.String(), "plugin=loop") >= 2
	})
	_, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "server at capacity") {
		t.Errorf("call with every instance busy: %v; want a capacity refusal", err)
	} else if je := rpcError(t, "call at capacity", err); je.Code != host.CodeAtCapacity {
		t.Errorf("call at capacity: code %d, want %d", je.Code, host.CodeAtCapacity)
	}
	cancel()
	wg.Wait()
}

func TestPerPluginLimit(t *testing.T) {
	f := newFixture(t, &host.Options{MaxInstancesPerPlugin: 1}, sandbox.NewPolicy(), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"trap.wasm":    testplugins.Test(t, "trap"),
	})
	a, b := f.connect(t, "", nil), f.connect(t, "", nil)
	call(t, a, "count", nil)
	call(t, a, "calls", nil)
	call(t, b, "count", nil) // evicts a's counter, not a's trap instance
	if n := f.h.LiveInstances(); n != 2 {
		t.Errorf("live = %d, want 2 (one per plugin)", n)
	}
	if got := text(call(t, a, "calls", nil)); got != "2" {
		t.Errorf("a's other plugin was evicted: calls = %s", got)
	}
}

// withCustomSection appends a custom section with a one-byte payload to a
// module (wazero v1.12 refuses an empty custom section at the very end).
func withCustomSection(wasm []byte, name string) []byte {
	uleb := func(n int) []byte {
		var b []byte
		for {
			c := byte(n & 0x7f)
			n >>= 7
			if n != 0 {
				c |= 0x80
			}
			b = append(b, c)
			if n == 0 {
				return b
			}
		}
	}
	body := append(append(uleb(len(name)), name...), '1')
	out := append([]byte{}, wasm...)
	out = append(out, 0)
	out = append(out, uleb(len(body))...)
	return append(out, body...)
}

func TestStatelessPluginsShareAPool(t *testing.T) {
	dir := t.TempDir()
	wasm := withCustomSection(testplugins.Bytes(t, testplugins.Example(t, "counter")), plugins.StatelessSection)
	os.WriteFile(filepath.Join(dir, "counter.wasm"), wasm, 0o644)
	rt, _ := sandbox.NewRuntime(sandbox.Options{})
	defer rt.Close(context.Background())
	cat, errs := plugins.LoadAll(context.Background(), rt, []string{dir}, nil)
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	if !cat.Plugins()[0].Stateless() {
		t.Fatal("the custom section did not make the plugin stateless")
	}
	defer cat.Close(context.Background())
	h := host.New(plugins.NewStatic(cat), &host.Options{PoolSize: 1})
	defer h.Close(context.Background())
	f := &fixture{rt: rt, h: h}
	a, b := f.connect(t, "", nil), f.connect(t, "", nil)
	// One warm instance serves both sessions in turn: the counter (which
	// lied about keeping no state) shows it.
	got := []string{text(call(t, a, "count", nil)), text(call(t, b, "count", nil)), text(call(t, a, "count", nil))}
	if strings.Join(got, ",") != "1,2,3" {
		t.Errorf("counts = %v, want 1,2,3 from one pooled instance", got)
	}
	if n := h.LiveInstances(); n != 1 {
		t.Errorf("live = %d, want 1 pooled", n)
	}
}

func TestManyConcurrentSessions(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	const sessions, calls = 200, 3
	clients := make([]*mcp.ClientSession, sessions)
	for i := range clients {
		clients[i] = f.connect(t, "", nil)
	}
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	start := make(chan struct{})
	for _, cs := range clients {
		wg.Go(func() {
			<-start
			for i := 1; i <= calls; i++ {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}})
				if err != nil {
					errs <- err
					return
				}
				if got := text(res); got != strconv.Itoa(i) {
					errs <- fmt.Errorf("call %d: count = %s", i, got)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.h.LiveInstances(); n != sessions {
		t.Errorf("live = %d, want %d", n, sessions)
	}
	for _, cs := range clients {
		cs.Close()
	}
	eventually(t, "all instances freed", func() bool { return f.h.LiveInstances() == 0 })
}

// rss reads the process's resident set size.
func rss(t *testing.T) int64 { return testplugins.RSS(t) }

func TestSessionsFreeTheirMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1000 sessions")
	}
	if host.RaceEnabled {
		t.Skip("RSS under the race detector includes its shadow memory; `make test` runs this test without -race too")
	}
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	warm := f.connect(t, "", nil)
	call(t, warm, "count", nil)
	base := rss(t)
	var clients []*mcp.ClientSession
	for range 1000 {
		cs := f.connect(t, "", nil)
		call(t, cs, "count", nil)
		clients = append(clients, cs)
	}
	peak := rss(t)
	for _, cs := range clients {
		cs.Close()
	}
	eventually(t, "instances freed", func() bool { return f.h.LiveInstances() == 1 })
	clients = nil
	after := rss(t)
	t.Logf("RSS: base %d KiB, 1000 live sessions %+d KiB, after closing %+d KiB", base>>10, (peak-base)>>10, (after-base)>>10)
	if grown, kept := peak-base, after-base; grown > 0 && kept > grown/2+8<<20 {
		t.Errorf("after closing 1000 sessions RSS is %d KiB over its baseline, of %d KiB at the peak: instances leak", kept>>10, grown>>10)
	}
}
