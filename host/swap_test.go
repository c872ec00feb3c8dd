package host_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// reloadFixture serves a folder through a reloader, as `wasmtools serve`
// does, with rescans driven by the test.
type reloadFixture struct {
	*fixture
	dir string
	r   *plugins.Reloader
}

func newReloadFixture(t *testing.T, files map[string][]byte) *reloadFixture {
	t.Helper()
	return newReloadFixtureWith(t, nil, files)
}

// newReloadFixtureWith is newReloadFixture with host options (nil for the
// defaults); their Logger is the fixture's.
func newReloadFixtureWith(t *testing.T, opts *host.Options, files map[string][]byte) *reloadFixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	for name, b := range files {
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	f := &fixture{log: &syncBuffer{}}
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	f.rt = rt
	r := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: []string{dir}})
	if _, errs := r.Load(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	o := host.Options{}
	if opts != nil {
		o = *opts
	}
	o.Logger = newTestLogger(f.log)
	f.h = host.New(r, &o)
	t.Cleanup(func() { f.h.Close(ctx); r.Close(ctx) })
	return &reloadFixture{fixture: f, dir: dir, r: r}
}

// deploy renames b into the folder as name and rescans.
func (f *reloadFixture) deploy(t *testing.T, name string, b []byte) {
	t.Helper()
	tmp := filepath.Join(f.dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, name)); err != nil {
		t.Fatal(err)
	}
	if _, errs := f.r.Rescan(context.Background()); len(errs) > 0 {
		t.Fatal(errs)
	}
}

func versionBytes(t testing.TB) ([]byte, []byte) {
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	return v1, bytes.Replace(v1, []byte(`"v1"`), []byte(`"v2"`), 1)
}

func TestSwapUnderLoad(t *testing.T) {
	v1, v2 := versionBytes(t)
	f := newReloadFixture(t, map[string][]byte{"versioned.wasm": v1})
	goroutines := runtime.NumGoroutine()
	const sessions, swaps = 8, 100
	var changed atomic.Int64
	clients := make([]*mcp.ClientSession, sessions)
	for i := range clients {
		clients[i] = f.connect(t, "", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, failures atomic.Int64
	var mu sync.Mutex
	seen := map[string]int{}
	answer := make(chan struct{}, 1) // a call was answered, or failed
	signal := func() {
		select {
		case answer <- struct{}{}:
		default:
		}
	}
	for _, cs := range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "version", Arguments: map[string]any{}})
				calls.Add(1)
				if err != nil || res.IsError {
					failures.Add(1)
					signal()
					t.Errorf("call failed: %v %v", err, res)
					if res != nil {
						t.Errorf("%s", text(res))
					}
					return
				}
				mu.Lock()
				seen[text(res)]++
				mu.Unlock()
				signal()
			}
		})
	}
	answered := func(v string) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[v]
	}
	for i := range swaps {
		want, b := "v1", v1
		if i%2 == 0 {
			want, b = "v2", v2
		}
		before := answered(want)
		f.deploy(t, "versioned.wasm", b)
		// Wait for a call answered by the new version, however slow the
		// machine, rather than sleeping a fixed time between swaps: woken
		// by each answer.
		timeout := time.After(30 * time.Second)
	wait:
		for answered(want) == before && failures.Load() == 0 {
			select {
			case <-answer:
			case <-timeout:
				t.Errorf("swap %d: no call answered %s in 30s", i, want)
				break wait
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls during %d swaps: %v; %d list_changed received", calls.Load(), swaps, seen, changed.Load())
	if failures.Load() > 0 {
		t.Fatalf("%d calls failed", failures.Load())
	}
	for answer := range seen {
		if answer != "v1" && answer != "v2" {
			t.Errorf("a call was answered %q", answer)
		}
	}
	if seen["v1"] == 0 || seen["v2"] == 0 {
		t.Errorf("answers %v: want both versions to have served", seen)
	}
	eventually(t, "list_changed", func() bool { return changed.Load() > 0 })
	for _, cs := range clients {
		cs.Close()
	}
	eventually(t, "instances to be freed", func() bool { return f.h.LiveInstances() == 0 })
	eventually(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines+5 })
}

func TestStateHandoff(t *testing.T) {
	notes := testplugins.Bytes(t, testplugins.Example(t, "notes"))
	notesV2 := withCustomSection(notes, "version-2")
	f := newReloadFixture(t, map[string][]byte{"notes.wasm": notes})
	a, b := f.connect(t, "", nil), f.connect(t, "2025-11-25", nil)
	call(t, a, "note_add", map[string]any{"text": "a1"})
	call(t, b, "note_add", map[string]any{"text": "b1"})

	f.deploy(t, "notes.wasm", notesV2)
	for _, c := range []struct {
		cs   *mcp.ClientSession
		want string
	}{{a, "1. a1\n"}, {b, "1. b1\n"}} {
		res := call(t, c.cs, "note_list", nil)
		up, _ := res.Meta[host.MetaUpgraded].(map[string]any)
		if text(res) != c.want || up["state"] != "restored" || up["sha256"] != shaOf(notesV2) {
			t.Errorf("after the upgrade: %q, _meta %v; want %q with the state restored", text(res), res.Meta, c.want)
		}
	}

	// A version whose restore fails: a fresh instance, and the client is told.
	f.deploy(t, "notes.wasm", testplugins.Bytes(t, testplugins.Test(t, "notesbad")))
	res := call(t, a, "note_list", nil)
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if text(res) != "no notes" || reset["reason"] != "upgrade" || !strings.Contains(fmt.Sprint(reset["detail"]), "could not be handed over") {
		t.Errorf("after a failed handoff: %q, _meta %v", text(res), res.Meta)
	}
}

func TestDeleteDuringCall(t *testing.T) {
	// hostileask's ask_plain waits for the user's answer, then fails with
	// it as its message: a call held in flight for as long as the test
	// wants, whatever the machine's speed.
	f := newReloadFixture(t, map[string][]byte{"hostileask.wasm": testplugins.Bytes(t, testplugins.Test(t, "hostileask"))})
	asked := make(chan struct{}, 1)
	release := make(chan struct{})
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked <- struct{}{}
		<-release
		return accept("ann"), nil
	}})
	done := make(chan *mcp.CallToolResult)
	go func() {
		res, _ := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_plain", Arguments: map[string]any{}})
		done <- res
	}()
	<-asked
	os.Remove(filepath.Join(f.dir, "hostileask.wasm"))
	if changed, _ := f.r.Rescan(context.Background()); !changed {
		t.Fatal("the deletion was not seen")
	}
	close(release)
	res := <-done
	if res == nil || !strings.Contains(text(res), "ann") || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("the call in flight did not finish on its version: %q %+v", text(res), res)
	}
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_plain", Arguments: map[string]any{}}); err == nil {
		t.Error("a removed tool was called")
	}
	eventually(t, "the instance to be freed", func() bool { return f.h.LiveInstances() == 0 })
}

func TestSwapWhileParked(t *testing.T) {
	pdk := testplugins.Bytes(t, testplugins.Test(t, "pdkhost"))
	f := newReloadFixture(t, map[string][]byte{"pdkhost.wasm": pdk})
	cs, first := rawRound(t, f.fixture, nil)
	f.deploy(t, "pdkhost.wasm", withCustomSection(pdk, "version-2"))
	second, err := retry(cs, first.RequestState, accept("ann"))
	if err != nil {
		t.Fatalf("the parked call did not resume after the swap: %v", err)
	}
	final, err := retry(cs, second.RequestState, accept("bo"))
	if err != nil || text(final) != "accept:ann,accept:bo" {
		t.Fatalf("final: %v %+v", err, final)
	}
	res := call(t, cs, "log", map[string]any{"level": "info", "message": "x"})
	if reset, _ := res.Meta[host.MetaStateReset].(map[string]any); reset["reason"] != "upgrade" {
		t.Errorf("the next call: _meta %v; want a new instance of the new version", res.Meta)
	}
}

// TestSwapAfterCloseClosesRetired: a reload that outlives the host (a
// configuration change's rescan running as the server stops) swaps into
// a closed host: the plugin it replaces is closed there, not retired into
// the session layer as it closes (CI saw that race under -race: the
// concurrent rounds below are for the race detector).
func TestSwapAfterCloseClosesRetired(t *testing.T) {
	v1, v2 := versionBytes(t)
	for range 8 {
		f := newReloadFixture(t, map[string][]byte{"versioned.wasm": v1})
		old := f.r.Catalogue().Plugins()[0]
		for range 3 {
			call(t, f.connect(t, "", nil), "version", nil) // instances of old
		}
		os.WriteFile(filepath.Join(f.dir, "versioned.wasm"), v2, 0o644)
		var wg sync.WaitGroup
		wg.Go(func() { f.h.Close(context.Background()) })
		wg.Go(func() { f.r.Rescan(context.Background()) })
		wg.Wait()
		f.deploy(t, "versioned.wasm", v1) // after Close, for certain
		if !old.Closed() && f.r.Catalogue().Plugins()[0] != old {
			t.Error("a version replaced after Close was not closed")
		}
	}
}
