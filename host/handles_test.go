package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// handleOf is the session handle a result carries in _meta.
func handleOf(res *mcp.CallToolResult) string {
	s, _ := res.Meta[host.MetaSession].(string)
	return s
}

// firstText is the plugin's own answer: the first text block.
func firstText(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	tc, _ := res.Content[0].(*mcp.TextContent)
	if tc == nil {
		return ""
	}
	return tc.Text
}

// countWith calls count, passing handle when not "".
func countWith(t *testing.T, cs *mcp.ClientSession, handle string) *mcp.CallToolResult {
	t.Helper()
	args := map[string]any{}
	if handle != "" {
		args[host.SessionArgument] = handle
	}
	return call(t, cs, "count", args)
}

// headerRecorder records the Mcp-Param-Wasmtools-Session header of each
// tools/call the client sends.
type headerRecorder struct {
	mu     sync.Mutex
	values []string
	next   http.RoundTripper
}

func (r *headerRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Mcp-Method") == "tools/call" {
		r.mu.Lock()
		r.values = append(r.values, req.Header.Get("Mcp-Param-"+host.SessionHeader))
		r.mu.Unlock()
	}
	next := r.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(req)
}

// bearer sends a bearer token.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// serveGuarded serves the fixture's host behind host.Guard.
func serveGuarded(t *testing.T, f *fixture, g host.GuardOptions) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	srv := httptest.NewServer(host.Guard(mux, g)) // 127.0.0.1
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestHandlesKeepState: go-sdk clients with default options over HTTP
// speak 2026-07-28, which has no session; passing back the handle their
// first result gave them, each keeps its own counter. The client mirrors
// the argument into the Mcp-Param-Wasmtools-Session header.
func TestHandlesKeepState(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	rec := &headerRecorder{}
	a := connectHTTP(t, url, "", rec)
	if v := a.InitializeResult().ProtocolVersion; v < "2026-07-28" {
		t.Fatalf("negotiated %s; want 2026-07-28", v)
	}
	tools, err := a.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		schema, _ := json.Marshal(tool.InputSchema)
		has := bytes.Contains(schema, []byte(`"`+host.SessionArgument+`"`)) && bytes.Contains(schema, []byte(`"x-mcp-header":"Wasmtools-Session"`))
		if want := tool.Name == "count"; has != want {
			t.Errorf("tool %s: session argument in schema = %v, want %v (only plugins that keep state): %s", tool.Name, has, want, schema)
		}
	}

	first := countWith(t, a, "")
	h := handleOf(first)
	if firstText(first) != "1" || h == "" {
		t.Fatalf("first call: %q, handle %q; want 1 and a handle", text(first), h)
	}
	if len(first.Content) != 2 || !strings.Contains(text(first), h) || !strings.Contains(text(first), host.SessionArgument) {
		t.Errorf("the minting result should end with a note naming the handle and the argument: %q", text(first))
	}
	for _, want := range []string{"2", "3"} {
		res := countWith(t, a, h)
		if firstText(res) != want || handleOf(res) != h || len(res.Content) != 1 {
			t.Errorf("with the handle: %q (handle %q, %d blocks); want %s, the same handle, no note", text(res), handleOf(res), len(res.Content), want)
		}
	}
	rec.mu.Lock()
	headers := append([]string(nil), rec.values...)
	rec.mu.Unlock()
	if len(headers) != 3 || headers[0] != "" || headers[1] != h || headers[2] != h {
		t.Errorf("Mcp-Param-%s headers sent = %q; want none, then the handle twice", host.SessionHeader, headers)
	}

	// A second client counts on its own handle.
	b := connectHTTP(t, url, "", nil)
	b.ListTools(context.Background(), nil) // so the client mirrors the header
	bh := handleOf(countWith(t, b, ""))
	if got := firstText(countWith(t, b, bh)); got != "2" || bh == h {
		t.Errorf("second client: count = %s with handle %q; want 2 on a handle of its own", got, bh)
	}
	// Without the handle, each call starts afresh, on a new handle.
	if res := countWith(t, a, ""); firstText(res) != "1" || handleOf(res) == h {
		t.Errorf("no handle: %q, handle %q; want 1 on a new handle", text(res), handleOf(res))
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "wasmtools_session_handles 3\n") {
		t.Errorf("metrics do not count 3 open handles:\n%s", body)
	}
}

// TestHandleRefused: a forged, altered or expired handle is an isError
// result that says so and offers a new handle; nothing runs.
func TestHandleRefused(t *testing.T) {
	// The timeout must outlast the refusals' calls on a loaded machine
	// (CI's -race run): the handle sits idle through six of them.
	f := newFixture(t, &host.Options{SessionTimeout: 3 * time.Second}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "", nil)
	cs.ListTools(context.Background(), nil)
	h := handleOf(countWith(t, cs, ""))
	if got := firstText(countWith(t, cs, h)); got != "2" {
		t.Fatalf("count = %s, want 2", got)
	}
	altered := h[:len(h)-2] + "AA"
	if altered == h {
		altered = h[:len(h)-2] + "BB"
	}
	for name, bad := range map[string]struct{ handle, why string }{
		"garbage": {"hello", "not a wasmtools session handle"},
		"altered": {altered, "not minted by this server"},
		// Well formed, so that the signature is what refuses it.
		"forged": {"wt1.AAAAAAAAAAAAAAAAAAAAAA.-.AAAAAAAAAAAAAAAAAAAAAA", "not minted by this server"},
	} {
		res := countWith(t, cs, bad.handle)
		nh := handleOf(res)
		if !res.IsError || !strings.Contains(text(res), "refused") || !strings.Contains(text(res), bad.why) || nh == "" || nh == h || !strings.Contains(text(res), nh) {
			t.Errorf("%s handle: isError=%v %q (new handle %q); want a refusal (%s) offering a new handle", name, res.IsError, text(res), nh, bad.why)
			continue
		}
		if got := firstText(countWith(t, cs, nh)); got != "1" {
			t.Errorf("%s: the offered handle counts %s; want 1 (a new state)", name, got)
		}
	}
	// The first handle's state was not touched by the refusals.
	if got := firstText(countWith(t, cs, h)); got != "3" {
		t.Errorf("count = %s after refusals, want 3", got)
	}
	// Unused for the session timeout, the handle expires: refused, not
	// silently fresh.
	eventually(t, "the handles' instances freed", func() bool { return f.h.LiveInstances() == 0 })
	res := countWith(t, cs, h)
	if !res.IsError || !strings.Contains(text(res), "expired") || handleOf(res) == "" {
		t.Errorf("expired handle: isError=%v %q; want a refusal saying it expired", res.IsError, text(res))
	}
}

// TestHandlesBoundToSubjects: with per-subject tokens, a handle works
// only for the subject it was minted for; with the shared token, which
// identifies no one, two clients still each keep their own state.
func TestHandlesBoundToSubjects(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	const shared, aliceTok, bobTok = "shared-token-0123456789", "alice-token-0123456789", "bob-token-0123456789"
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceTok, "bob": bobTok}})

	alice := connectHTTP(t, url, "", bearer{aliceTok})
	alice.ListTools(context.Background(), nil)
	ah := handleOf(countWith(t, alice, ""))
	if got := firstText(countWith(t, alice, ah)); got != "2" {
		t.Errorf("alice: count = %s, want 2", got)
	}
	bob := connectHTTP(t, url, "", bearer{bobTok})
	bob.ListTools(context.Background(), nil)
	res := countWith(t, bob, ah)
	if !res.IsError || !strings.Contains(text(res), "another client") {
		t.Errorf("bob with alice's handle: isError=%v %q; want refused", res.IsError, text(res))
	}
	if got := firstText(countWith(t, alice, ah)); got != "3" {
		t.Errorf("alice after bob's attempt: count = %s, want 3", got)
	}

	// The shared token: two clients, two states.
	c1 := connectHTTP(t, url, "", bearer{shared})
	c2 := connectHTTP(t, url, "", bearer{shared})
	c1.ListTools(context.Background(), nil)
	c2.ListTools(context.Background(), nil)
	h1, h2 := handleOf(countWith(t, c1, "")), handleOf(countWith(t, c2, ""))
	got := []string{firstText(countWith(t, c1, h1)), firstText(countWith(t, c2, h2)), firstText(countWith(t, c1, h1))}
	if strings.Join(got, ",") != "2,2,3" {
		t.Errorf("shared token: counts %v; want 2,2,3 (each client its own state)", got)
	}
	// A shared-token handle is bound to no one; a subject may not use it.
	if res := countWith(t, alice, h1); !res.IsError {
		t.Errorf("alice with an unbound handle: %q; want refused", text(res))
	}
}

// TestHandleHeaderChecked: the server checks the Mcp-Param header against
// the argument (SEP-2243), derives it when it is missing (with
// DeriveSessionHeader; without, the conformance suite checks it is
// refused), and a prompt or resource request may carry the
// handle in the header or _meta.
func TestHandleHeaderChecked(t *testing.T) {
	f := newFixture(t, &host.Options{DeriveSessionHeader: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "", nil)
	cs.ListTools(context.Background(), nil)
	h := handleOf(countWith(t, cs, ""))

	post := func(header string, args string) (int, string) {
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":` + args +
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
		h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"count"}}
		if header != "" {
			h.Set("Mcp-Param-"+host.SessionHeader, header)
		}
		return rawPost(t, url, body, h)
	}
	arg := `{"` + host.SessionArgument + `":"` + h + `"}`
	if code, body := post(h, arg); code != 200 || !strings.Contains(body, `"text":"2"`) {
		t.Errorf("matching header: %d %s", code, body)
	}
	if code, body := post("wt1.-.other", arg); code == 200 && !strings.Contains(body, "mismatch") {
		t.Errorf("header that does not match the argument: %d %s; want refused", code, body)
	}
	// A client whose tool cache was dropped (list_changed) sends the
	// argument without its header: the header is derived from it.
	if code, body := post("", arg); code != 200 || !strings.Contains(body, `"text":"3"`) {
		t.Errorf("argument without its header: %d %s; want served with the handle", code, body)
	}
	if got := firstText(countWith(t, cs, h)); got != "4" {
		t.Errorf("count = %s, want 4 (the refused request ran nothing)", got)
	}
}

// TestStatelessPluginsTakeNoHandle: a plugin that keeps no state serves
// its tools without the session argument, and its results carry no
// handle.
func TestStatelessPluginsTakeNoHandle(t *testing.T) {
	src := filepath.Join(t.TempDir(), "counter.wasm")
	wasm := withCustomSection(testplugins.Bytes(t, testplugins.Example(t, "counter")), plugins.StatelessSection)
	if err := os.WriteFile(src, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": src})
	cs := connectHTTP(t, serveHTTP(t, f), "", nil)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	schema, _ := json.Marshal(tools.Tools[0].InputSchema)
	if bytes.Contains(schema, []byte(host.SessionArgument)) {
		t.Errorf("a stateless plugin's tool takes the session argument: %s", schema)
	}
	if res := call(t, cs, "count", nil); handleOf(res) != "" || len(res.Content) != 1 {
		t.Errorf("a stateless plugin's result carries a handle or a note: %q %v", text(res), res.Meta)
	}
}

// TestHostileHandleFlood: a client that never passes its handle back
// mints one per call. The open handles, and the instances behind them,
// stay within MaxHandles, and a client that does use its handle keeps its
// state through the flood.
func TestHostileHandleFlood(t *testing.T) {
	const max = 5
	f := newFixture(t, &host.Options{MaxHandles: max}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	good := connectHTTP(t, url, "", nil)
	good.ListTools(context.Background(), nil)
	h := handleOf(countWith(t, good, ""))
	countWith(t, good, h)
	flood := connectHTTP(t, url, "", nil)
	for i := range 6 * max {
		if res := countWith(t, flood, ""); firstText(res) != "1" {
			t.Fatalf("flood call %d: %q", i, text(res))
		}
		if n := f.h.LiveInstances(); n > max {
			t.Fatalf("after %d minting calls: %d live instances; want at most %d", i+1, n, max)
		}
	}
	if got := firstText(countWith(t, good, h)); got != "3" {
		t.Errorf("the client that uses its handle: count = %s after the flood, want 3", got)
	}
}

// connectHTTPWith is connectHTTP with client options.
func connectHTTPWith(t *testing.T, url string, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestHandleParkedCall: a call that asks the user is parked between the
// 2026-07-28 client's requests on its handle's instance, and its final
// result carries the handle.
func TestHandleParkedCall(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")})
	url := serveHTTP(t, f)
	yes := &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}
	cs := connectHTTPWith(t, url, &mcp.ClientOptions{ElicitationHandler: (&answerer{answers: []*mcp.ElicitResult{yes}}).handler})
	cs.ListTools(context.Background(), nil)
	h := handleOf(call(t, cs, "add", map[string]any{"item": "milk"}))
	call(t, cs, "add", map[string]any{"item": "eggs", host.SessionArgument: h})
	res := call(t, cs, "delete", map[string]any{"item": "milk", host.SessionArgument: h})
	if firstText(res) != `deleted "milk"` || handleOf(res) != h {
		t.Errorf("delete: %q (handle %q); want deleted on the same handle", text(res), handleOf(res))
	}
	if got := firstText(call(t, cs, "list", map[string]any{host.SessionArgument: h})); got != "eggs" {
		t.Errorf("list = %q, want eggs", got)
	}
}

// TestHandleResources: a resource read that carries the handle, in _meta
// or in the Mcp-Param header, runs on the handle's instance.
func TestHandleResources(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "", nil)
	cs.ListTools(context.Background(), nil)
	h := handleOf(call(t, cs, "note_add", map[string]any{"text": "a secret"}))
	read := func(meta mcp.Meta) string {
		t.Helper()
		res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "notes://all", Meta: meta})
		if err != nil {
			return "error: " + err.Error()
		}
		return res.Contents[0].Text
	}
	if got := read(mcp.Meta{host.MetaSession: h}); !strings.Contains(got, "a secret") {
		t.Errorf("read with the handle in _meta: %q; want the handle's note", got)
	}
	if got := read(nil); strings.Contains(got, "a secret") {
		t.Errorf("read without a handle sees the handle's note: %q", got)
	}
	if got := read(mcp.Meta{host.MetaSession: "wt1.-.x.-.y"}); !strings.Contains(got, "refused") {
		t.Errorf("read with a forged handle: %q; want refused", got)
	}
	// The header, as a load balancer would see it.
	hc := connectHTTP(t, url, "", headerTransport{"Mcp-Param-" + host.SessionHeader, h})
	res, err := hc.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "notes://all"})
	if err != nil || !strings.Contains(res.Contents[0].Text, "a secret") {
		t.Errorf("read with the handle in the header: %v %v", res, err)
	}
}

// TestHandleInMeta: a client that passes handles itself may put them in
// _meta (no tools/list needed, no header); its results carry no note.
func TestHandleInMeta(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cs := connectHTTP(t, serveHTTP(t, f), "", nil) // no ListTools
	callMeta := func(h string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Meta: mcp.Meta{host.MetaSession: h}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first := callMeta("") // "mint me one"
	h := handleOf(first)
	if h == "" || len(first.Content) != 1 {
		t.Fatalf("minting through _meta: %q, handle %q; want a handle and no note", text(first), h)
	}
	if res := callMeta(h); firstText(res) != "2" || handleOf(res) != h {
		t.Errorf("count = %q on handle %q; want 2 on %q", text(res), handleOf(res), h)
	}
	// Quiet by the operator: the minting result of a model's call has no note.
	q := newFixture(t, &host.Options{QuietHandles: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	qs := connectHTTP(t, serveHTTP(t, q), "", nil)
	if res := call(t, qs, "count", nil); handleOf(res) == "" || len(res.Content) != 1 {
		t.Errorf("QuietHandles: %q (handle %q); want the handle in _meta only", text(res), handleOf(res))
	}
	// A plugin's own setting overrides the host's.
	l := newFixture(t, &host.Options{QuietHandles: true, QuietPlugins: map[string]bool{"counter": false}}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	ls := connectHTTP(t, serveHTTP(t, l), "", nil)
	if res := call(t, ls, "count", nil); len(res.Content) != 2 {
		t.Errorf("QuietPlugins[counter] = false under QuietHandles: %q; want the note", text(res))
	}
	// A handle in _meta that is not a string is refused, not a fresh state.
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Meta: mcp.Meta{host.MetaSession: 7}})
	if err != nil || !res.IsError {
		t.Errorf("a number as the handle: %v %v; want an isError result", res, err)
	}
}

// TestDisconnectCancels: a 2026-07-28 client cancels by closing the
// request's stream; the guest stops at once (its call timeout is minutes)
// and its instance is reset, and the handle's other plugin is untouched.
func TestDisconnectCancels(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(10*time.Minute), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"loop.wasm":    testplugins.Test(t, "loop"),
	})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "", nil)
	cs.ListTools(context.Background(), nil)
	h := handleOf(countWith(t, cs, ""))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{host.SessionArgument: h}})
		errc <- err
	}()
	eventually(t, "the spinning call to start", func() bool { return f.h.LiveInstancesByPlugin()["loop"] == 1 })
	cancel() // the go-sdk client closes the request's connection
	// The spinning guest stops, its instance reset; or the cancel came
	// after the instance started but before the guest ran (the call is
	// refused, logged as such, and its untouched instance kept): either
	// way no call holds an instance.
	eventually(t, "the guest to stop, its instance reset", func() bool {
		refused := strings.Contains(f.log.String(), `msg="call refused" tool=spin`)
		return f.h.BusyInstances() == 0 && (refused || f.h.LiveInstancesByPlugin()["loop"] == 0)
	})
	select {
	case err := <-errc:
		if err == nil {
			t.Error("cancelled call returned no error")
		}
	case <-time.After(time.Minute):
		t.Fatal("the cancelled call did not return")
	}
	if got := firstText(countWith(t, cs, h)); got != "2" {
		t.Errorf("the handle's counter = %s after the cancelled call, want 2 (its instance untouched)", got)
	}
}

// TestUnreturnedHandlesReclaimed: a client that ignores handles mints one
// per call; the instances of handles never passed back are freed past
// sessions.DefaultMaxUnreturned (well before --max-handles), and a handle
// passed back after that gets a fresh instance with its reset said.
func TestUnreturnedHandlesReclaimed(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cs := connectHTTP(t, serveHTTP(t, f), "", nil)
	// A client that lists the tools mirrors the handle into its header.
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	first := handleOf(countWith(t, cs, ""))
	for range 200 {
		countWith(t, cs, "")
	}
	if live := f.h.LiveInstancesByPlugin()["counter"]; live > sessions.DefaultMaxUnreturned+1 {
		t.Errorf("%d live instances after 201 handle-less calls, want at most %d", live, sessions.DefaultMaxUnreturned+1)
	}
	res := countWith(t, cs, first)
	if _, reset := res.Meta[host.MetaStateReset]; !reset || firstText(res) != "1" {
		t.Errorf("the first handle passed back: %q, _meta %v; want a fresh count with the reset said", firstText(res), res.Meta)
	}
}

// TestRefusedCallForgetsItsHandle: a call that mints a handle and is then
// refused (here past its subject's call rate) answers with a JSON-RPC
// error, which carries no handle; the handle is ended at once rather
// than left open, and counted against MaxHandles, until the session
// timeout. (A task cancelled before its guest ran is refused the same
// way, with its instance started: TestTaskBounds.)
func TestRefusedCallForgetsItsHandle(t *testing.T) {
	f := newFixture(t, &host.Options{CallsPerSecondPerSubject: 0.01}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	handles := func() string {
		rec := httptest.NewRecorder()
		f.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return regexp.MustCompile(`(?m)^wasmtools_session_handles (\S+)$`).FindString(rec.Body.String())
	}
	if res, e := rpc(t, url, "tools/call", "count", map[string]any{"name": "count"}, map[string]any{}); e != nil || res["_meta"] == nil {
		t.Fatalf("the first call: %v %v; want a result with its handle", res, e)
	}
	if got := handles(); got != "wasmtools_session_handles 1" {
		t.Fatalf("after one minting call: %q", got)
	}
	for range 5 {
		if res, e := rpc(t, url, "tools/call", "count", map[string]any{"name": "count"}, map[string]any{}); e == nil || e["code"] != float64(host.CodeBusy) {
			t.Fatalf("a call past the rate: %v %v; want CodeBusy", res, e)
		}
	}
	if got := handles(); got != "wasmtools_session_handles 1" {
		t.Errorf("after five refused calls: %q; want the first call's handle only", got)
	}
}
