package host_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The protocol revisions tests run under: the last one with sessions and
// initialize, and the one the go-sdk client negotiates by default.
var protocols = []string{"2025-11-25", ""}

type fixture struct {
	rt  *sandbox.Runtime
	h   *host.Host
	log *syncBuffer
}

type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced by every Write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	defer activity.fire()
	return s.b.Write(p)
}

// activity is fired by what the host does in the background that tests
// wait on: every write to a fixture's log (the host logs each instance it
// makes, frees, resets or evicts) and every notification a test client's
// handler counts. eventually re-checks its condition on each.
var activity pulse

// pulse is a broadcast: fire wakes everyone waiting on next.
type pulse struct {
	mu sync.Mutex
	ch chan struct{}
}

func (p *pulse) next() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil {
		p.ch = make(chan struct{})
	}
	return p.ch
}

func (p *pulse) fire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
}

// next returns a channel closed by the next Write: the host's log is the
// readiness signal of what it does in the background.
func (s *syncBuffer) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		s.written = make(chan struct{})
	}
	return s.written
}

// waitLog waits until the log holds sub n times, woken by each write, for
// at most a minute (a loaded machine).
func (f *fixture) waitLog(t *testing.T, sub string, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		next := f.log.next()
		if strings.Count(f.log.String(), sub) >= n {
			return
		}
		select {
		case <-next:
		case <-timeout:
			t.Fatalf("the host did not log %q in a minute:\n%s", sub, f.log.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture serves the plugin files (name -> path) with policy.
func newFixture(t *testing.T, opts *host.Options, policy sandbox.Policy, files map[string]string) *fixture {
	t.Helper()
	return newFixtureWith(t, opts, func(string) plugins.Options { return plugins.Options{Policy: &policy} }, files)
}

// newFixtureWith serves the plugin files (name -> path), each with the
// options optsFor gives its path (its policy logs to the fixture's log).
func newFixtureWith(t *testing.T, opts *host.Options, optsFor func(path string) plugins.Options, files map[string]string) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{log: &syncBuffer{}}
	logger := newTestLogger(f.log)
	var err error
	if f.rt, err = sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.rt.Close(ctx) })
	dir := testplugins.Folder(t, files)
	cat, errs := plugins.LoadAll(ctx, f.rt, []string{dir}, func(path string) plugins.Options {
		o := optsFor(path)
		pol := sandbox.NewPolicy()
		if o.Policy != nil {
			pol = *o.Policy
		}
		pol = pol.WithLogger(logger)
		o.Policy = &pol
		return o
	})
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	o := host.Options{}
	if opts != nil {
		o = *opts
	}
	o.Logger = logger
	f.h = host.New(plugins.NewStatic(cat), &o)
	t.Cleanup(func() { f.h.Close(ctx) })
	return f
}

// connect opens a go-sdk client session to the host over the in-memory
// transport, negotiating protocol ("" for the client's default).
func (f *fixture) connect(t *testing.T, protocol string, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := f.h.Server().Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// eventually waits until cond holds, re-checking it on each activity
// (a log write, a counted notification), for at most 30 s. It is for
// counts read from the host or a client's handlers (LiveInstances, a
// handler's tally); a log line is waited for with waitLog. A count that
// changes with no activity (runtime.NumGoroutine: a goroutine ends with
// no signal) is re-checked at least once a second meanwhile.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		next := activity.next()
		if cond() {
			return
		}
		select {
		case <-next:
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestListTools(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"hash.wasm":    testplugins.Example(t, "hash"),
		"counter.wasm": testplugins.Example(t, "counter"),
	})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			cs := f.connect(t, proto, nil)
			if caps := cs.InitializeResult().Capabilities; caps.Tools == nil || !caps.Tools.ListChanged {
				t.Errorf("tools capability = %+v, want listChanged", caps.Tools)
			}
			res, err := cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tl := range res.Tools {
				names = append(names, tl.Name)
			}
			if diff := cmp.Diff([]string{"base64", "count", "hash"}, names); diff != "" {
				t.Errorf("tools (-want +got):\n%s", diff)
			}
			hash := res.Tools[2]
			schema, _ := json.Marshal(hash.InputSchema)
			if !strings.Contains(string(schema), `"enum":["md5","sha1","sha256","sha512"]`) || hash.Annotations == nil || !hash.Annotations.ReadOnlyHint {
				t.Errorf("hash tool lost its schema or annotations: %s %+v", schema, hash.Annotations)
			}
		})
	}
}

func TestEmptyCatalogue(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), nil)
	for _, proto := range protocols {
		cs := f.connect(t, proto, nil)
		if caps := cs.InitializeResult().Capabilities; caps.Tools == nil || !caps.Tools.ListChanged {
			t.Errorf("%s: tools capability = %+v, want listChanged with no plugins", proto, caps.Tools)
		}
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil || len(res.Tools) != 0 {
			t.Errorf("%s: tools/list = %v, %v; want none", proto, res, err)
		}
	}
}

func TestCallTool(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"hash.wasm":    testplugins.Example(t, "hash"),
		"servlet.wasm": testplugins.Test(t, "servlet"),
	})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			cs := f.connect(t, proto, nil)
			res := call(t, cs, "hash", map[string]any{"text": "abc"})
			if res.IsError || text(res) != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
				t.Errorf("hash(abc) = %q (isError %v)", text(res), res.IsError)
			}
			res = call(t, cs, "echo", map[string]any{"text": "héllo ✓"})
			if res.IsError || text(res) != "héllo ✓" {
				t.Errorf("echo = %q (isError %v)", text(res), res.IsError)
			}
		})
	}
}

func TestBadArguments(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"hash.wasm": testplugins.Example(t, "hash")})
	cs := f.connect(t, "", nil)
	tests := []struct {
		name string
		args any
		want string
	}{
		{"missing required", map[string]any{}, "text"},
		{"wrong type", map[string]any{"text": 42}, `type "integer", want "string"`},
		{"bad enum", map[string]any{"text": "a", "algorithm": "crc"}, "enum"},
		{"unknown property", map[string]any{"text": "a", "salt": "x"}, "salt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := call(t, cs, "hash", tt.args)
			if !res.IsError || !strings.Contains(text(res), "invalid arguments") || !strings.Contains(text(res), tt.want) {
				t.Errorf("result %q (isError %v); want an invalid-arguments error mentioning %q", text(res), res.IsError, tt.want)
			}
		})
	}
	if f.h.LiveInstances() != 0 {
		t.Errorf("%d instances live: invalid calls must not start the guest", f.h.LiveInstances())
	}
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "nope", Arguments: map[string]any{}}); err == nil {
		t.Error("calling an unknown tool succeeded")
	}
}

func TestGuestFailures(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"servlet.wasm": testplugins.Test(t, "servlet"),
		"trap.wasm":    testplugins.Test(t, "trap"),
	})
	cs := f.connect(t, "", nil)
	other := f.connect(t, "", nil)

	if got := text(call(t, cs, "calls", nil)); got != "1" {
		t.Fatalf("calls = %q, want 1", got)
	}
	if got := text(call(t, other, "calls", nil)); got != "1" {
		t.Fatalf("other session: calls = %q, want 1", got)
	}
	if got := text(call(t, cs, "calls", nil)); got != "2" {
		t.Fatalf("calls = %q, want 2", got)
	}
	res := call(t, cs, "boom", nil)
	if !res.IsError || !strings.Contains(text(res), `tool "boom" crashed`) || !strings.Contains(text(res), "unreachable") {
		t.Errorf("trap result %q (isError %v)", text(res), res.IsError)
	}
	res = call(t, cs, "calls", nil)
	if text(res) != "1" {
		t.Errorf("after the trap: calls = %q, want 1 from a fresh instance", text(res))
	}
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if reset["reason"] != "trap" {
		t.Errorf("_meta = %v; want %s with reason trap", res.Meta, host.MetaStateReset)
	}
	if res := call(t, cs, "calls", nil); res.Meta[host.MetaStateReset] != nil {
		t.Errorf("the reset was reported twice: %v", res.Meta)
	}
	if got := text(call(t, other, "calls", nil)); got != "2" {
		t.Errorf("other session after cs's trap: calls = %q, want 2 (its state must survive)", got)
	}

	res = call(t, cs, "fail", nil)
	if !res.IsError || text(res) != `tool "fail" failed: failed on purpose` {
		t.Errorf("guest error result %q (isError %v)", text(res), res.IsError)
	}
	res = call(t, cs, "panic", nil)
	if !res.IsError || !strings.Contains(text(res), "crashed") {
		t.Errorf("panic result %q (isError %v)", text(res), res.IsError)
	}
	if res := call(t, cs, "echo", map[string]any{"text": "ok"}); res.IsError || text(res) != "ok" {
		t.Errorf("after a panic: %q", text(res))
	}
}

func TestSessionsHaveOwnState(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			a, b := f.connect(t, proto, nil), f.connect(t, proto, nil)
			call(t, a, "note_add", map[string]any{"text": "a's secret"})
			call(t, b, "note_add", map[string]any{"text": "b's note"})
			call(t, a, "note_add", map[string]any{"text": "a again"})
			if got := text(call(t, a, "note_list", nil)); got != "1. a's secret\n2. a again\n" {
				t.Errorf("a sees %q", got)
			}
			if got := text(call(t, b, "note_list", nil)); got != "1. b's note\n" {
				t.Errorf("b sees %q", got)
			}
		})
	}
}

func TestSessionEndFreesInstances(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	var sessions []*mcp.ClientSession
	for range 5 {
		cs := f.connect(t, "", nil)
		call(t, cs, "count", nil)
		sessions = append(sessions, cs)
	}
	f.connect(t, "", nil) // a session that never calls costs no instance
	if n := f.h.LiveInstances(); n != 5 {
		t.Fatalf("live instances = %d, want 5", n)
	}
	for _, cs := range sessions {
		cs.Close()
	}
	eventually(t, "instances to be freed", func() bool { return f.h.LiveInstances() == 0 })
	if !strings.Contains(f.log.String(), "instance freed") {
		t.Error("no instance freed was logged")
	}
}

func TestResultCap(t *testing.T) {
	f := newFixture(t, &host.Options{MaxResultRunes: 100}, sandbox.NewPolicy(), map[string]string{"servlet.wasm": testplugins.Test(t, "servlet")})
	cs := f.connect(t, "", nil)
	res := call(t, cs, "repeat", map[string]any{"text": "é", "count": 250})
	if len(res.Content) != 2 {
		t.Fatalf("content blocks = %d, want the cut text and a note", len(res.Content))
	}
	// A text block costs its text and 26 characters of JSON besides.
	kept := res.Content[0].(*mcp.TextContent).Text
	if n := utf8.RuneCountInString(kept); n != 74 {
		t.Errorf("kept %d runes, want 74", n)
	}
	note := res.Content[1].(*mcp.TextContent).Text
	if !strings.Contains(note, "176 characters of text cut") {
		t.Errorf("note = %q", note)
	}
	if res := call(t, cs, "repeat", map[string]any{"text": "é", "count": 74}); len(res.Content) != 1 {
		t.Errorf("a result at the limit was cut: %d blocks", len(res.Content))
	}
}

func TestTimeoutAndQueueLimit(t *testing.T) {
	// The second call must come while the first still spins: the timeout
	// is 20 times a new session's first call (an instance and a call)
	// measured here, and at least a second, so that it follows the load.
	warm := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	ws := warm.connect(t, "", nil)
	start := time.Now()
	call(t, ws, "count", nil)
	timeout := max(time.Second, 20*time.Since(start))
	f := newFixture(t, &host.Options{QueueLimit: 1}, sandbox.NewPolicy().WithCallTimeout(timeout), map[string]string{"loop.wat.wasm": testplugins.Test(t, "loop")})
	cs := f.connect(t, "", nil)
	done := make(chan *mcp.CallToolResult)
	go func() {
		res, _ := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
		done <- res
	}()
	eventually(t, "the first call to start", func() bool { return f.h.LiveInstances() == 1 })
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "too many calls waiting") {
		t.Errorf("second call while one runs with queue limit 1: %v; want refusal", err)
	}
	res := <-done
	if res == nil || !res.IsError || !strings.Contains(text(res), "timed out") {
		t.Fatalf("spinning call: %+v; want a timed-out error result", res)
	}
	if n := f.h.LiveInstances(); n != 0 {
		t.Errorf("live instances after timeout = %d, want 0 (discarded)", n)
	}
}

func TestCancelStopsGuest(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"loop.wasm": testplugins.Test(t, "loop")})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			cs := f.connect(t, proto, nil)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
				errc <- err
			}()
			eventually(t, "the call to hold its instance", func() bool { return f.h.BusyInstances() == 1 })
			cancel()
			if err := <-errc; err == nil {
				t.Error("cancelled call returned no error")
			}
			// Stopped and reset, or cancelled before it ran: no call
			// holds an instance.
			eventually(t, "the guest to stop", func() bool { return f.h.BusyInstances() == 0 })
		})
	}
}

func TestCatalogueChangeNotifies(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{"counter.wasm": testplugins.Bytes(t, testplugins.Example(t, "counter"))})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			changed := make(chan struct{}, 10)
			cs := f.connect(t, proto, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
			call(t, cs, "count", nil)

			f.deploy(t, "hash.wasm", testplugins.Bytes(t, testplugins.Example(t, "hash")))
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
				t.Fatal("no tools/list_changed")
			}
			res, err := cs.ListTools(context.Background(), nil)
			if err != nil || len(res.Tools) != 3 {
				t.Fatalf("tools after the change: %v, %v", res, err)
			}
			if got := text(call(t, cs, "count", nil)); got != "2" {
				t.Errorf("count after an unrelated change = %q, want 2 (same instance)", got)
			}
			if err := os.Remove(filepath.Join(f.dir, "hash.wasm")); err != nil {
				t.Fatal(err)
			}
			if _, errs := f.r.Rescan(context.Background()); len(errs) > 0 {
				t.Fatal(errs)
			}
			<-changed
		})
	}
}

func ExampleHost() {
	ctx := context.Background()
	rt, _ := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	defer rt.Close(ctx)
	cat, errs := plugins.LoadAll(ctx, rt, []string{testplugins.Root() + "/examples/plugins/dist/counter.wasm"}, nil)
	if len(errs) > 0 {
		fmt.Println(errs)
		return
	}
	defer cat.Close(ctx)
	h := host.New(plugins.NewStatic(cat), nil)
	defer h.Close(ctx)

	st, ct := mcp.NewInMemoryTransports()
	h.Server().Connect(ctx, st, nil)
	cs, _ := mcp.NewClient(&mcp.Implementation{Name: "example"}, nil).Connect(ctx, ct, nil)
	defer cs.Close()
	for range 2 {
		res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}})
		fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	}
	// Output:
	// 1
	// 2
}

func TestRichContent(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"servlet.wasm": testplugins.Test(t, "servlet")})
	res := call(t, f.connect(t, "", nil), "image", nil)
	if len(res.Content) != 2 {
		t.Fatalf("content = %v", res.Content)
	}
	img, ok := res.Content[0].(*mcp.ImageContent)
	if !ok || string(img.Data) != "hello" || img.MIMEType != "image/png" {
		t.Errorf("image block = %#v", res.Content[0])
	}
	if tc, ok := res.Content[1].(*mcp.TextContent); !ok || tc.Text != "caption" || tc.Annotations == nil {
		t.Errorf("annotated text block = %#v", res.Content[1])
	}
	if b, _ := json.Marshal(res.StructuredContent); string(b) != `{"n":1}` || res.Meta["x.example/k"] != "v" {
		t.Errorf("structured %s, meta %v", b, res.Meta)
	}
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func shaOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
