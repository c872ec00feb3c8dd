package host_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// replica is one host of a replica set in this process, served over HTTP
// on 127.0.0.1.
type replica struct {
	*fixture
	name string
	srv  *httptest.Server
}

var replicaKey = []byte("replica test state key, shared by every replica")

func newReplica(t *testing.T, name string, store statestore.Store, policy sandbox.Policy) *replica {
	t.Helper()
	return newReplicaOf(t, name, store, policy, map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
}

func newReplicaOf(t *testing.T, name string, store statestore.Store, policy sandbox.Policy, files map[string]string) *replica {
	t.Helper()
	return replicaWith(t, host.Options{Replica: name, Store: store}, policy, files)
}

// replicaWith is newReplicaOf with options of the test's own (their
// state key replicaKey), serving /mcp and /readyz.
func replicaWith(t *testing.T, opts host.Options, policy sandbox.Policy, files map[string]string) *replica {
	t.Helper()
	opts.StateKey = replicaKey
	f := newFixture(t, &opts, policy, files)
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	mux.Handle("/readyz", f.h.ReadyHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &replica{fixture: f, name: opts.Replica, srv: srv}
}

// logsOnFailure shows the replicas' logs if the test fails.
func logsOnFailure(t *testing.T, rs ...*replica) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, r := range rs {
			t.Logf("%s's log:\n%s", r.name, r.log.String())
		}
	})
}

// twoReplicas are replicas a and b of the notes example sharing a store,
// and a router pointing at a.
func twoReplicas(t *testing.T) (a, b *replica, rt *router) {
	t.Helper()
	store := statestore.NewMemory()
	a = newReplica(t, "a", store, sandbox.NewPolicy())
	b = newReplica(t, "b", store, sandbox.NewPolicy())
	return a, b, &router{to: a}
}

// gone is the replica killed: its connections cut, its listener closed.
func (r *replica) gone() {
	r.srv.CloseClientConnections()
	r.srv.Close()
}

// router is a proxy in a test: it sends every request to the replica it
// points at now, as a proxy whose rule moved would.
type router struct {
	mu    sync.Mutex
	to    *replica
	seen  map[string]bool // replicas that served a request
	token string          // a subject's bearer token, sent if set
}

func (r *router) point(to *replica) {
	r.mu.Lock()
	r.to = to
	r.mu.Unlock()
}

func (r *router) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	to := r.to
	r.mu.Unlock()
	u, _ := url.Parse(to.srv.URL)
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, u.Host
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	return http.DefaultTransport.RoundTrip(req)
}

// notes returns the text of note_list.
func notes(t *testing.T, cs *mcp.ClientSession, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	return call(t, cs, "note_list", args)
}

func TestStatefulSessionMovesToAnotherReplica(t *testing.T) {
	a, b, rt := twoReplicas(t)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if !strings.HasPrefix(cs.ID(), "a.") {
		t.Fatalf("session ID %q does not begin with the replica's name", cs.ID())
	}
	for i := range 3 {
		if res := call(t, cs, "note_add", map[string]any{"text": fmt.Sprint("note ", i)}); res.IsError {
			t.Fatal(text(res))
		}
	}
	// a is gone (its listener closed, nothing drained): the proxy sends
	// the session's next request to b.
	a.gone()
	rt.point(b)
	logsOnFailure(t, a, b)
	res := notes(t, cs, nil)
	if res.IsError || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("after the move: %v %s", res.Meta, text(res))
	}
	for i := range 3 {
		if !strings.Contains(text(res), fmt.Sprint("note ", i)) {
			t.Fatalf("note %d lost in the move:\n%s", i, text(res))
		}
	}
	b.waitLog(t, "session taken over from the state store", 1)
	// The session goes on at b, with its state.
	if res := call(t, cs, "note_add", map[string]any{"text": "at b"}); res.IsError || !strings.Contains(text(res), "note 4 saved") {
		t.Fatalf("note_add at b: %s", text(res))
	}
}

func TestHandleMovesToAnotherReplica(t *testing.T) {
	a, b, rt := twoReplicas(t)
	cs := connectHTTP(t, a.srv.URL, "", rt) // 2026-07-28: no session
	cs.ListTools(context.Background(), nil)
	res := call(t, cs, "note_add", map[string]any{"text": "first"})
	handle, _ := res.Meta[host.MetaSession].(string)
	if !strings.HasPrefix(handle, "a.wt1.") {
		t.Fatalf("handle %q does not begin with the replica's name", handle)
	}
	call(t, cs, "note_add", map[string]any{"text": "second", host.SessionArgument: handle})
	a.gone()
	rt.point(b)
	res = notes(t, cs, map[string]any{host.SessionArgument: handle})
	if res.IsError || !strings.Contains(text(res), "1. first") || !strings.Contains(text(res), "2. second") {
		t.Fatalf("after the move: %v %s", res.Meta, text(res))
	}
}

func TestStateResetWhenPluginCannotBeSnapshotted(t *testing.T) {
	// nosnapshot drops a data segment, which the host cannot capture, and
	// has no handoff pair.
	policy := sandbox.NewPolicy()
	store := statestore.NewMemory()
	files := map[string]string{"nosnapshot.wasm": testplugins.Test(t, "nosnapshot")}
	a := newReplicaOf(t, "a", store, policy, files)
	b := newReplicaOf(t, "b", store, policy, files)
	for _, protocol := range protocols {
		t.Run("protocol="+cmpOr(protocol, "default"), func(t *testing.T) {
			rt := &router{to: a}
			cs := connectHTTP(t, a.srv.URL, protocol, rt)
			cs.ListTools(context.Background(), nil)
			call(t, cs, "count", nil)
			res := call(t, cs, "count", nil)
			args := map[string]any{}
			if handle, _ := res.Meta[host.MetaSession].(string); handle != "" {
				args[host.SessionArgument] = handle
			}
			rt.point(b)
			res = call(t, cs, "count", args)
			reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
			if reset["reason"] != "replica-lost" || text(res) != "1" {
				t.Fatalf("want a replica-lost reset and a count from 1, got %v: %s", res.Meta, text(res))
			}
			// Said once: the next result has no reset.
			if res := call(t, cs, "count", args); res.Meta[host.MetaStateReset] != nil || text(res) != "2" {
				t.Fatalf("reset said twice: %v", res.Meta)
			}
			rt.point(a)
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestDrainHandsSessionsOver(t *testing.T) {
	a, b, rt := twoReplicas(t)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	call(t, cs, "note_add", map[string]any{"text": "before the drain"})

	ready := func(r *replica) int {
		res, err := http.Get(r.srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := ready(a); got != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d", got)
	}
	done := make(chan error, 1)
	go func() { done <- a.h.Drain(context.Background(), host.DrainOptions{}) }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := ready(a); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz after the drain: %d", got)
	}
	// A new session at a is refused with a status a proxy retries.
	res, err := http.Post(a.srv.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a new session at a draining replica: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	a.waitLog(t, "drained", 1)
	rt.point(b)
	if r := notes(t, cs, nil); r.IsError || !strings.Contains(text(r), "before the drain") {
		t.Fatalf("after the drain: %s", text(r))
	}
	// a released its claim: b took it over from no one.
	if strings.Contains(b.log.String(), "holderAlive=true") {
		t.Fatalf("b took the session from a live holder:\n%s", b.log.String())
	}
}

// Two replicas that both receive requests for one session (a proxy's
// rule flapping) each take it over; the store's fences let exactly one
// write at a time, so no call that succeeded loses its note.
func TestRacingTakeoversLoseNoUpdate(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	b := newReplica(t, "b", store, sandbox.NewPolicy())
	c := newReplica(t, "c", store, sandbox.NewPolicy())
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	call(t, cs, "note_add", map[string]any{"text": "base"})
	a.gone()

	var ok atomic.Int32
	var wg sync.WaitGroup
	for i, r := range []*replica{b, c, b, c, b, c} {
		wg.Go(func() {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"note_add","arguments":{"text":"race %d"}}}`, i+10, i)
			status, resp := postSession(t, r.srv.URL, cs.ID(), body)
			if status == http.StatusOK && strings.Contains(resp, "saved") && !strings.Contains(resp, `"isError":true`) {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() == 0 {
		t.Fatal("no racing call succeeded")
	}
	// Whoever holds the session now serves every note that was saved.
	rt.point(b)
	list := text(notes(t, cs, nil))
	got := strings.Count(list, "race ")
	if got != int(ok.Load()) || !strings.Contains(list, "base") {
		t.Fatalf("%d calls succeeded, the notepad has %d of them:\n%s", ok.Load(), got, list)
	}
}

// postSession posts one JSON-RPC message in stateful session id, and
// returns the status and what the response said up to its result.
func postSession(t *testing.T, base, id, body string) (int, string) {
	t.Helper()
	res := postInSession(t, base, id, body)
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil || strings.Contains(b.String(), `"result"`) || strings.Contains(b.String(), `"error"`) {
			break
		}
	}
	return res.StatusCode, b.String()
}

// A call parked for a 2026-07-28 client's answer lives in its guest,
// mid-call, at the replica that runs it: a retry that reaches another
// replica is told which replica the call was parked on.
func TestParkedCallDoesNotMove(t *testing.T) {
	store := statestore.NewMemory()
	files := map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")}
	a := newReplicaOf(t, "a", store, sandbox.NewPolicy(), files)
	b := newReplicaOf(t, "b", store, sandbox.NewPolicy(), files)
	rt := &router{to: a}
	answer := func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		rt.point(b) // a goes away while the person thinks
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}, nil
	}
	tr := &mcp.StreamableClientTransport{Endpoint: a.srv.URL + "/mcp", HTTPClient: &http.Client{Transport: rt}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: answer}).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	cs.ListTools(context.Background(), nil)
	h := handleOf(call(t, cs, "add", map[string]any{"item": "milk"}))
	_, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "delete", Arguments: map[string]any{"item": "milk", host.SessionArgument: h}})
	if err == nil || !strings.Contains(err.Error(), `replica "a"`) {
		t.Fatalf("the retry at b: %v; want an error naming replica a", err)
	}
	// The session itself moved: its state is at b.
	if got := firstText(call(t, cs, "list", map[string]any{host.SessionArgument: h})); got != "milk" {
		t.Fatalf("list at b = %q, want milk", got)
	}
}

// With the store gone, sessions go on at the replica that holds them
// (for a grace of 2 s after their claim was last verified; then they are
// refused with the retryable -32053 until the store answers, since
// another replica may have taken them over), and new ones are served (not
// kept).
func TestStoreLostSessionsGoOn(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	call(t, cs, "note_add", map[string]any{"text": "before"})
	store.Close()
	if res := call(t, cs, "note_add", map[string]any{"text": "after"}); res.IsError {
		t.Fatalf("a call with the store gone: %s", text(res))
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	switch {
	case err != nil && !strings.Contains(err.Error(), "unavailable"):
		t.Fatalf("notes with the store gone: %v; want them, or the -32053 refusal", err)
	case err == nil && text(res) != "1. before\n2. after\n":
		t.Fatalf("notes with the store gone: %q", text(res))
	}
	fresh := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	if res := call(t, fresh, "note_add", map[string]any{"text": "new"}); res.IsError {
		t.Fatalf("a new session with the store gone: %s", text(res))
	}
	a.waitLog(t, "state store unavailable", 1)
}

// A task's ID names its replica, so a proxy routes its requests there
// (Mcp-Name); one that reaches another replica is told which one runs it.
func TestTaskNamesItsReplica(t *testing.T) {
	store := statestore.NewMemory()
	files := map[string]string{"everything.wasm": testplugins.Example(t, "everything")}
	a := newReplicaOf(t, "a", store, sandbox.NewPolicy(), files)
	b := newReplicaOf(t, "b", store, sandbox.NewPolicy(), files)
	id := startTask(t, a.srv.URL, "slow_compute", map[string]any{"seconds": 0.05, "label": "x"})
	if !strings.HasPrefix(id, "a.t1.") {
		t.Fatalf("task ID %q does not begin with its replica's name", id)
	}
	_, e := rpc(t, b.srv.URL, "tasks/get", id, map[string]any{"taskId": id}, withTasks)
	if msg, _ := e["message"].(string); !strings.Contains(msg, `replica "a"`) {
		t.Fatalf("tasks/get at b: %v; want an error naming replica a", e)
	}
	if res, e := rpc(t, a.srv.URL, "tasks/get", id, map[string]any{"taskId": id}, withTasks); e != nil || res["taskId"] != id {
		t.Fatalf("tasks/get at a: %v %v", res, e)
	}
}

// A stateful session is its authenticated user's on every replica: another
// user presenting its ID does not take it over.
// guardedReplicas are replicas a and b of the notes example sharing a
// store, each behind bearer tokens for alice and bob.
func guardedReplicas(t *testing.T) (srvs [2]*httptest.Server, tokens map[string]string) {
	t.Helper()
	store := statestore.NewMemory()
	tokens = map[string]string{"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
	for i, name := range []string{"a", "b"} {
		f := newFixture(t, &host.Options{Replica: name, Store: store, StateKey: replicaKey}, sandbox.NewPolicy(),
			map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
		srvs[i] = httptest.NewServer(host.RequireTokens("", tokens, f.h.HTTPHandler()))
		t.Cleanup(srvs[i].Close)
	}
	return srvs, tokens
}

func TestTakeoverKeepsTheSessionsUser(t *testing.T) {
	srvs, tokens := guardedReplicas(t)
	as := func(token string) http.RoundTripper { return headerTransport{"Authorization", "Bearer " + token} }
	alice := connectHTTP(t, srvs[0].URL, "2025-11-25", as(tokens["alice"]))
	call(t, alice, "note_add", map[string]any{"text": "alice's"})
	// bob, at b, with alice's session ID.
	req, _ := http.NewRequest(http.MethodPost, srvs[1].URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"note_list","arguments":{}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", alice.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+tokens["bob"])
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || strings.Contains(string(body), "alice's") {
		t.Fatalf("bob with alice's session at b: %d %s; want 404", res.StatusCode, body)
	}
	// alice herself, at b, is served.
	req.Header.Set("Authorization", "Bearer "+tokens["alice"])
	req.Body = io.NopCloser(strings.NewReader(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"note_list","arguments":{}}}`))
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "alice's") {
		t.Fatalf("alice at b: %d %s", res.StatusCode, body)
	}
}

// With a store, an instance evicted for room comes back from its saved
// state on its client's next call: the client sees no reset.
func TestEvictedInstanceComesBackFromTheStore(t *testing.T) {
	f := newFixture(t, &host.Options{Store: statestore.NewMemory(), StateKey: replicaKey, MaxInstances: 1}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	url := serveHTTP(t, f)
	a := connectHTTP(t, url, "2025-11-25", nil)
	b := connectHTTP(t, url, "2025-11-25", nil)
	call(t, a, "note_add", map[string]any{"text": "a's"})
	call(t, b, "note_add", map[string]any{"text": "b's"}) // evicts a's instance
	f.waitLog(t, "instance evicted", 1)
	res := notes(t, a, nil) // evicts b's, restores a's
	if res.Meta[host.MetaStateReset] != nil || text(res) != "1. a's\n" {
		t.Fatalf("a after its instance was evicted: %v %q", res.Meta, text(res))
	}
	if res := notes(t, b, nil); res.Meta[host.MetaStateReset] != nil || text(res) != "1. b's\n" {
		t.Fatalf("b after its instance was evicted: %v %q", res.Meta, text(res))
	}
}

// A session is in the store before its initialize is answered: a replica
// that dies between its answer and the client's initialized (the fault
// suite's kill9-under-load met it, with a client beginning a new session
// just before the kill) leaves a session that another replica takes over,
// for its own user only.
func TestSessionKeptBeforeInitializeAnswered(t *testing.T) {
	srvs, tokens := guardedReplicas(t)
	post := func(srv *httptest.Server, token, id, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		if id != "" {
			req.Header.Set("Mcp-Session-Id", id)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res, string(b)
	}
	res, body := post(srvs[0], tokens["alice"], "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	id := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize at a: %d %q %s", res.StatusCode, id, body)
	}
	// a is gone before the client's initialized reached it.
	srvs[0].CloseClientConnections()
	srvs[0].Close()
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"note_list","arguments":{}}}`
	if res, body := post(srvs[1], tokens["bob"], id, list); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob with alice's session at b: %d %s; want 404", res.StatusCode, body)
	}
	if res, body := post(srvs[1], tokens["alice"], id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); res.StatusCode/100 != 2 {
		t.Fatalf("initialized at b: %d %s", res.StatusCode, body)
	}
	if res, body := post(srvs[1], tokens["alice"], id, list); res.StatusCode != http.StatusOK || !strings.Contains(body, `"result"`) || strings.Contains(body, `"isError":true`) {
		t.Fatalf("alice's first call at b: %d %s", res.StatusCode, body)
	}
}

// A session made while the store did not answer (its record not written
// at its initialize) is written whole by its first claim once the store
// answers: another replica can take it over. Its first claim used to
// write a record without the initialize to replay, which no replica could
// take over. (From a review.)
func TestSessionMadeWhileStoreDownCanBeTakenOver(t *testing.T) {
	madeWhileStoreDown(t, "one", nil, func(ctx context.Context, m *madeDown) {
		if err := m.a.h.WaitStore(ctx); err != nil {
			t.Fatal(err)
		}
		if res := call(t, m.cs, "note_add", map[string]any{"text": "one"}); res.Meta[host.MetaNotSaved] != nil {
			t.Fatalf("first call not saved: %v", res.Meta)
		}
		m.a.gone()
	})
}

// A session made while the store did not answer, and served from memory
// only (its record not written, no claim), has its record written by its
// replica's drain once the store answers again, its breaker still open
// (the drain asks the store all the same): another replica takes it
// over. Drain saved only the sessions this replica had claimed, and such
// a session was gone with the replica: its next call elsewhere was
// answered 404, which ends it at the client (the fault suite's
// partition-store-flapping: a session begun at the cut-off replica in its
// last cut, drained 1 s after the link came back). Its note, served from
// memory (notSaved), is in the record too: the drain's claim keeps the
// instances of a session no other replica can have served, and the
// drain writes them.
func TestSessionMadeWhileStoreDownSavedByDrain(t *testing.T) {
	madeWhileStoreDown(t, "one", func(ctx context.Context, m *madeDown) {
		if res := call(t, m.cs, "note_add", map[string]any{"text": "one"}); res.Meta[host.MetaNotSaved] == nil {
			t.Fatalf("a call with the store away said saved: %v", res.Meta)
		}
	}, func(ctx context.Context, m *madeDown) {
		// The record is written while a is still ready: a proxy
		// sends the session's next request elsewhere once it is not.
		var readyAtClaim atomic.Int32
		spy := func(id string) {
			if id == "s."+m.cs.ID() && readyAtClaim.Load() == 0 {
				readyAtClaim.Store(map[bool]int32{true: 1, false: 2}[m.a.h.Ready()])
			}
		}
		m.store.claimed.Store(&spy)
		m.rt.point(m.b)
		if err := m.a.h.Drain(ctx, host.DrainOptions{}); err != nil {
			t.Fatalf("drain: %v", err)
		}
		if got := readyAtClaim.Load(); got != 1 {
			t.Errorf("the drain's claim of the session: made %v", map[int32]string{0: "never", 2: "once a was not ready"}[got])
		}
	})
}

// madeWhileStoreDown makes a session at replica a while the store does
// not answer, runs down (if any) before the store answers again and then
// back, which hands the session on; replica b must then serve it, with
// note want (if any).
func madeWhileStoreDown(t *testing.T, want string, down, back func(ctx context.Context, m *madeDown)) {
	store := &claimSpy{downStore: downStore{failingStore{Store: statestore.NewMemory()}}}
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	b := newReplica(t, "b", store, sandbox.NewPolicy())
	rt := &router{to: a}
	logsOnFailure(t, a, b)
	store.failing.Store(true)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	a.waitLog(t, "new session not kept", 1)
	m := &madeDown{a: a, b: b, rt: rt, cs: cs, store: store}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if down != nil {
		down(ctx, m)
	}
	store.failing.Store(false)
	back(ctx, m)
	rt.point(b)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "note_list"})
	if err != nil {
		t.Fatalf("at b, a's session: %v", err)
	}
	if !strings.Contains(text(res), want) {
		t.Fatalf("at b, a's session: %q; want note %q", text(res), want)
	}
}

// madeDown is madeWhileStoreDown's world: the session cs made at a, the
// store they share.
type madeDown struct {
	a, b  *replica
	rt    *router
	cs    *mcp.ClientSession
	store *claimSpy
}

// claimSpy is a downStore that calls claimed (if set) with the record ID
// of each claim answered.
type claimSpy struct {
	downStore
	claimed atomic.Pointer[func(id string)]
}

func (s *claimSpy) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	if f := s.claimed.Load(); f != nil && !s.failing.Load() {
		(*f)(id)
	}
	return s.downStore.Claim(ctx, id, o, ttl, steal)
}

// heldStore holds the first Claim of record id until released (or its
// context ends), and says when it is held.
type heldStore struct {
	statestore.Store
	mu      sync.Mutex
	id      string
	entered chan struct{}
	release chan struct{}
}

func (s *heldStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	s.mu.Lock()
	held := id == s.id
	if held {
		s.id = ""
	}
	s.mu.Unlock()
	if held {
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
			return statestore.Claim{}, ctx.Err()
		}
	}
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

// A takeover's exchanges with the store do not hold up the replica's new
// sessions: while b waits on the store for a session it takes over (its
// claim held, with a store timeout of a minute), another client's
// initialize at b is answered. The takeover's replayed initialize used to
// write the record under adoptMu, which every new session waits on.
// (From a review.)
func TestTakeoverStoreWaitDoesNotHoldNewSessions(t *testing.T) {
	shared := statestore.NewMemory()
	atB := &heldStore{Store: shared, entered: make(chan struct{}), release: make(chan struct{})}
	a := newReplica(t, "a", shared, sandbox.NewPolicy())
	b := replicaWith(t, host.Options{Replica: "b", Store: atB, StoreTimeout: time.Minute}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	call(t, cs, "note_add", map[string]any{"text": "one"})
	atB.mu.Lock()
	atB.id = "s." + cs.ID()
	atB.mu.Unlock()
	a.gone()
	rt.point(b)
	released := false
	defer func() {
		if !released {
			close(atB.release)
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
		done <- err
	}()
	select {
	case <-atB.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("b never claimed the session it takes over")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, err := mcp.NewClient(&mcp.Implementation{Name: "other", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: b.srv.URL + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	released = true
	close(atB.release)
	if err != nil {
		t.Fatalf("a new session at b while b's takeover waits on the store: %v", err)
	}
	other.Close()
	if err := <-done; err != nil {
		t.Fatalf("the call of the session taken over: %v", err)
	}
}

// A contained plugin's call (notes: no host function of the host's, no
// grant) runs before its claim is checked, and its checkpoint checks it.
// A session that went to b and came back finds a's instance stale: the
// call, a read or a write, runs again at a once a has taken the session
// over from the store, and sees what b wrote.
func TestContainedCallOnStaleInstanceRunsAgain(t *testing.T) {
	a, b, rt := twoReplicas(t)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	logsOnFailure(t, a, b)
	add := func(note, want string) {
		t.Helper()
		addNote(t, cs, note, want)
	}
	twoNotesThenOneAt(t, cs, rt, b)
	rt.point(a) // a's instance holds two notes: stale
	res := notes(t, cs, nil)
	if res.IsError || res.Meta[host.MetaStateReset] != nil || res.Meta[host.MetaNotSaved] != nil || !strings.Contains(text(res), "three at b") {
		t.Fatalf("a read on a's stale instance: %v %s", res.Meta, text(res))
	}
	a.waitLog(t, "call ran on a stale instance", 1)
	rt.point(b)
	add("four at b", "note 4 saved")
	rt.point(a)
	add("five at a", "note 5 saved") // a write on a's stale instance would say note 4
	a.waitLog(t, "call ran on a stale instance", 2)
	rt.point(b)
	if res := notes(t, cs, nil); res.IsError || !strings.Contains(text(res), "five at a") {
		t.Fatalf("at b after a's write: %v %s", res.Meta, text(res))
	}
}

// claimCounter counts the claims made of it.
type claimCounter struct {
	statestore.Store
	claims atomic.Int64
}

func (s *claimCounter) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

// A warm call of a contained plugin makes one exchange with the store,
// its fenced write, and no claim; a plugin that reports progress (a
// message to the client while it runs) is claimed before each call.
func TestContainedCallIsNotClaimedFirst(t *testing.T) {
	store := &claimCounter{Store: statestore.NewMemory()}
	f := newFixture(t, &host.Options{Replica: "a", Store: store, StateKey: replicaKey}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes"), "slownotes.wasm": testplugins.Test(t, "slownotes")})
	srv := httptest.NewServer(f.h.HTTPHandler())
	t.Cleanup(srv.Close)
	cs := connectHTTP(t, srv.URL, "2025-11-25", nil)
	warm := func(tool string, args map[string]any) int64 {
		t.Helper()
		call(t, cs, tool, args) // its instance made
		before := store.claims.Load()
		for range 5 {
			if res := call(t, cs, tool, args); res.IsError || res.Meta[host.MetaNotSaved] != nil {
				t.Fatalf("%s: %v %s", tool, res.Meta, text(res))
			}
		}
		return store.claims.Load() - before
	}
	if n := warm("note_add", map[string]any{"text": "x"}); n != 0 {
		t.Errorf("5 warm calls of a contained plugin made %d claims, want 0", n)
	}
	if n := warm("note_list", nil); n != 0 {
		t.Errorf("5 warm reads of a contained plugin made %d claims, want 0", n)
	}
	if n := warm("slow_add", map[string]any{"text": "x", "steps": 1}); n != 5 {
		t.Errorf("5 warm calls of a plugin that reports progress made %d claims, want 5", n)
	}
}

// A warm call of a contained Go plugin that changes its state costs the
// Redis store one write (issue 27, item 4): its checkpoint's script,
// with the state's bytes staged beside it (a value of 16 KiB or more) in
// the same pipeline, and no claim, read or renewal of the session before
// or after it; a base now and then (a state written whole) is a second
// write. Seen by redis-server's MONITOR, which lists what every client
// sent, the scripts' own commands apart ("lua"): of those, each command
// on the session's keys counts (sessionWrites), and nothing else (the
// replica's heartbeat and key check run meanwhile).
func TestContainedCheckpointIsOneRedisWrite(t *testing.T) {
	addr := proxytest.StartRedis(t)
	f := newFixture(t, &host.Options{Replica: "a", Store: redisStore(t, addr), StateKey: replicaKey}, sandbox.NewPolicy(),
		map[string]string{"servlet.wasm": testplugins.Test(t, "servlet")})
	srv := httptest.NewServer(f.h.HTTPHandler())
	t.Cleanup(srv.Close)
	cs := connectHTTP(t, srv.URL, "2025-11-25", nil)
	varCount := func(want int) {
		t.Helper()
		if res := call(t, cs, "var_count", map[string]any{}); res.IsError || text(res) != strconv.Itoa(want) || res.Meta[host.MetaNotSaved] != nil {
			t.Fatalf("var_count: %v %s, want %d", res.Meta, text(res), want)
		}
	}
	// The first calls claim the session and write its first states and
	// base.
	for n := range 3 {
		varCount(n + 1)
	}

	lines := monitorRedis(t, addr)
	const calls = 20
	for n := range calls {
		varCount(n + 4)
	}
	const marker = "wasmtools-monitor-end"
	if err := proxytest.RedisCommand(func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }, "ECHO "+marker, "$"); err != nil {
		t.Fatal(err)
	}

	var sent []string
	for line := range lines {
		if strings.Contains(line, marker) {
			break
		}
		sent = append(sent, line)
	}
	w := sessionWrites(sent, "s."+cs.ID())
	states, bases, staged, other := w.states, w.bases, w.staged, w.other
	t.Logf("%d calls: %d state writes, %d bases, %d staged values", calls, states, bases, staged)
	if states != calls || staged > states+bases || len(other) > 0 {
		t.Errorf("%d calls sent %d state writes (want %d), %d bases, %d staged values, and %d other commands of the session:\n%s",
			calls, states, calls, bases, staged, len(other), strings.Join(other, "\n"))
	}
	if bases > calls/4 {
		t.Errorf("%d calls wrote %d bases", calls, bases)
	}
}

// redisWrites sorts what clients sent a session's keys.
type redisWrites struct {
	states, bases, staged int      // the servlet's checkpoint scripts and staged values
	other                 []string // any other command on its keys, cut short
}

// sessionWrites sorts the MONITOR lines of commands a client sent on
// store session id's keys (wt:{id}:…), and only those: the replica's
// heartbeat, its epoch reads and its key check (wt:{wt-keycheck}) run
// while the calls do, and a script's own commands are the script's. A
// command of a shape other than a checkpoint's, however short, is other.
func sessionWrites(lines []string, id string) redisWrites {
	var w redisWrites
	prefix := "wt:{" + id + "}:"
	for _, line := range lines {
		if strings.Contains(line, " lua] ") {
			continue
		}
		args := monitorArgs(line)
		if len(args) < 2 || !slices.ContainsFunc(args[1:], func(a string) bool { return strings.HasPrefix(a, prefix) }) {
			continue
		}
		cmd := strings.ToLower(args[0])
		switch {
		case cmd == "evalsha" || cmd == "eval":
			// A checkpoint's script: its keys, then its fence (two
			// arguments) and the field it writes.
			field := ""
			if len(args) > 2 {
				if keys, err := strconv.Atoi(args[2]); err == nil && keys >= 0 && 3+keys+2 < len(args) {
					field = args[3+keys+2]
				}
			}
			switch field {
			case "f:p/servlet":
				w.states++
			case "f:b/servlet":
				w.bases++
			default:
				w.other = append(w.other, short(line))
			}
		case cmd == "set" && strings.HasPrefix(args[1], prefix+"s:"):
			w.staged++
		default:
			w.other = append(w.other, short(line))
		}
	}
	return w
}

// sessionWrites counts the commands on the session's own keys, each
// once, and only those: the replica's heartbeat, its epoch and its key
// check (a script of the store's on other keys, with fewer arguments
// than a checkpoint's) run while the calls do, and a script's own
// commands are part of it.
func TestSessionWritesCountsTheSessionsCommands(t *testing.T) {
	const id = "s.a.SESSION"
	lines := []string{
		`+1.0 [0 127.0.0.1:1] "evalsha" "sha" "4" "wt:{s.a.SESSION}:rec" "wt:{s.a.SESSION}:fence" "wt:epoch" "wt:{s.a.SESSION}:v:p/servlet" "1" "7" "f:p/servlet" "\x02..."`,
		`+1.1 [0 lua] "HSET" "wt:{s.a.SESSION}:rec" "f:p/servlet" "\x02..."`,
		`+1.2 [0 127.0.0.1:2] "evalsha" "sha2" "1" "wt:{wt-keycheck}:rec"`, // the heartbeat's key check: a Get
		`+1.3 [0 127.0.0.1:2] "evalsha" "sha3" "3" "wt:{wt-keycheck}:rec" "wt:{wt-keycheck}:fence" "wt:epoch" "wt:owner:keycheck/-" "31536000000" "f:check"`,
		`+1.4 [0 127.0.0.1:2] "set" "wt:owner:a/boot" "1" "PX" "6000"`,
		`+1.5 [0 127.0.0.1:1] "set" "wt:{s.a.SESSION}:s:RAND" "\x02..." "PX" "60000"`,
		`+1.6 [0 127.0.0.1:1] "evalsha" "sha" "4" "wt:{s.a.SESSION}:rec" "wt:{s.a.SESSION}:fence" "wt:epoch" "wt:{s.a.SESSION}:v:b/servlet" "1" "8" "f:b/servlet" "\x02..."`,
		`+1.7 [0 127.0.0.1:3] "evalsha" "sha4" "1" "wt:{s.a.OTHER}:rec" "x"`, // another session's
		`+1.8 [0 127.0.0.1:1] "evalsha" "sha5" "1" "wt:{s.a.SESSION}:rec"`,   // a short script on the session: other
		`+1.9 [0 127.0.0.1:1] "hget" "wt:{s.a.SESSION}:rec" "m:owner"`,
		`+2.0 [0 127.0.0.1:1] "evalsha" "wt:{s.a.SESSION}:rec"`, // shorter still
	}
	w := sessionWrites(lines, id)
	if w.states != 1 || w.bases != 1 || w.staged != 1 || len(w.other) != 3 ||
		!strings.Contains(w.other[0], `"sha5"`) || !strings.Contains(w.other[1], `"hget"`) {
		t.Errorf("%d states, %d bases, %d staged, other %q; want 1, 1, 1 and the session's two short scripts and hget", w.states, w.bases, w.staged, w.other)
	}
}

// monitorRedis runs MONITOR on the Redis at addr and returns its lines
// from then on, until the test ends.
func monitorRedis(t *testing.T, addr string) <-chan string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReaderSize(c, 1<<20)
	if ok, err := r.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", ok, err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimRight(line, "\r\n")
		}
	}()
	return lines
}

// short is line cut to 200 bytes.
func short(line string) string { return line[:min(len(line), 200)] }

// monitorArgs is the command and arguments of a MONITOR line, each
// quoted there, with its escapes left as they are.
func monitorArgs(line string) []string {
	var args []string
	for i := strings.Index(line, "] ") + 2; i < len(line); i++ {
		if line[i] != '"' {
			continue
		}
		j := i + 1
		for ; j < len(line) && line[j] != '"'; j++ {
			if line[j] == '\\' {
				j++
			}
		}
		args = append(args, line[i+1:min(j, len(line))])
		i = j
	}
	return args
}

// The store came back empty while a's claim looked current; b served the
// session after that (writing it back under the new epoch) and then
// drained (its claim released, its record kept). a's next contained call
// runs on a's stale instance; its checkpoint's fenced write is refused as
// lost (the old epoch), relost claims the session and finds no holder
// (b released it). a used to write its stale state back over b's and
// send the stale result (a review found it); relost now reads the record
// after its claim, as verify does: it holds plugins' states, so the call
// runs again, claimed first, and is answered from b's.
func TestStaleContainedCallAfterStoreLostAndDrain(t *testing.T) {
	store := statestore.NewMemory()
	a, b, rt, cs := pair(t, store, store)
	twoNotesThenOneAt(t, cs, rt, b)             // a's instance is stale now; a does not know
	store.Flush()                               // the store comes back empty
	addNote(t, cs, "four at b", "note 4 saved") // b writes the session back under the new epoch
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.h.Drain(ctx, host.DrainOptions{}); err != nil {
		t.Fatalf("b's drain: %v", err)
	}
	rt.point(a)
	res := notes(t, cs, nil)
	if res.IsError || !strings.Contains(text(res), "four at b") {
		t.Fatalf("a read at a after b wrote and drained: %v %s\n(b acknowledged notes 3 and 4)", res.Meta, text(res))
	}
}

// landThenStallStore lands the next plugin-state Put armed for it, then
// holds the caller until its deadline: a write whose answer was lost (a
// Redis script runs on after its caller gave up).
type landThenStallStore struct {
	statestore.Store
	armed atomic.Bool
}

func (s *landThenStallStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if strings.HasPrefix(field, "p/") && s.armed.CompareAndSwap(true, false) {
		if err := s.Store.Put(ctx, id, field, v, fence, ttl); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

// One checkpoint write of a contained call gets no answer (it landed: a
// Redis script runs on after its caller gave up), on a session whose claim
// was last verified more than 2 s before (here the store's timeout, 2.5 s,
// is that long; with the default 1 s, any session idle for 2 s). The call
// ran before its claim was checked, and the claim cannot be checked now
// (the breaker is open): it fails, saying its effect may or may not have
// been kept, never "not kept" (durable.ErrOutcomeUnknown). Its instance is
// kept, and the session goes on, here with the call's effect: not reset
// as not saved (a review found the plugin's whole state reset so).
func TestLostAnswerOfContainedWriteResetsNothing(t *testing.T) {
	store := &landThenStallStore{Store: statestore.NewMemory()}
	a := replicaWith(t, host.Options{Replica: "a", Store: store, StoreTimeout: 2500 * time.Millisecond}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	logsOnFailure(t, a)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	for _, n := range []string{"one", "two"} {
		if res := call(t, cs, "note_add", map[string]any{"text": n}); res.IsError {
			t.Fatal(text(res))
		}
	}
	store.armed.Store(true)
	res := call(t, cs, "note_add", map[string]any{"text": "three"})
	if !res.IsError || !strings.Contains(text(res), "may or may not have been kept") {
		t.Errorf("a call whose write got no answer, unverified: %v %s; want a failure whose outcome is unknown", res.Meta, text(res))
	}
	// The breaker closes 2 s after the lost answer: until then the
	// session's requests are refused, to be retried.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
		if err == nil {
			if res.IsError || res.Meta[host.MetaStateReset] != nil || !strings.Contains(text(res), "three") {
				t.Fatalf("the session after one lost answer: %v %s; want the three notes the store holds", res.Meta, text(res))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("note_list still refused: %v", err)
		}
		<-time.After(100 * time.Millisecond)
	}
}

// addNote adds note with the notes example's note_add and wants its
// result to say want.
func addNote(t *testing.T, cs *mcp.ClientSession, note, want string) {
	t.Helper()
	if res := call(t, cs, "note_add", map[string]any{"text": note}); res.IsError || !strings.Contains(text(res), want) {
		t.Fatalf("note_add %q: %v %s", note, res.Meta, text(res))
	}
}

// twoNotesThenOneAt adds notes "one" and "two" where rt points, then
// points rt at b and adds "three at b" there.
func twoNotesThenOneAt(t *testing.T, cs *mcp.ClientSession, rt *router, b *replica) {
	t.Helper()
	addNote(t, cs, "one", "note 1 saved")
	addNote(t, cs, "two", "note 2 saved")
	rt.point(b)
	addNote(t, cs, "three at b", "note 3 saved")
}

// A session that moves to a replica serving another version of its plugin
// loses that plugin's state, and its next result says so (replica-lost):
// the store keeps host snapshots, which restore only into the same code,
// even for a plugin that exports the handoff pair (the notes example),
// whose handoff runs only where the old version still runs. DEPLOY said
// otherwise until stop 64 (a red team).
func TestReplacedPluginOnFallbackSaysReplicaLost(t *testing.T) {
	nb := testplugins.Bytes(t, testplugins.Example(t, "notes"))
	v2 := filepath.Join(t.TempDir(), "notes.wasm")
	if err := os.WriteFile(v2, withCustomSection(nb, "version-2"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := statestore.NewMemory()
	a := newReplicaOf(t, "a", store, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	b := newReplicaOf(t, "b", store, sandbox.NewPolicy(), map[string]string{"notes.wasm": v2})
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if res := call(t, cs, "note_add", map[string]any{"text": "kept"}); res.IsError {
		t.Fatal(text(res))
	}
	a.gone()
	rt.point(b)
	res := notes(t, cs, nil)
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if strings.Contains(text(res), "kept") || reset == nil || reset["reason"] != "replica-lost" {
		t.Fatalf("moved to a replica serving notes v2: got %q, stateReset %v; want the state lost, said replica-lost", text(res), reset)
	}
}

// TestDrainSavesOthersPastALongCall: a drain whose grace one client's
// call outlasts still saves and hands over every other client's session.
// Bob's call of loop's spin runs until its call timeout (a minute), past
// the drain's grace; alice's session, idle, is saved at the drain
// (CheckpointOnDrain) and taken over by b with her note. A red team
// found the drain spent its whole grace waiting for bob's call and then
// saved every session under the grace's ended context: none was saved
// nor released, and alice's note was lost at b.
func TestDrainSavesOthersPastALongCall(t *testing.T) {
	store := statestore.NewMemory()
	policy := sandbox.NewPolicy().WithCallTimeout(time.Minute)
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes"), "loop.wasm": testplugins.Test(t, "loop")}
	a := replicaWith(t, host.Options{Replica: "a", Store: store, Checkpoint: host.CheckpointOnDrain}, policy, files)
	b := replicaWith(t, host.Options{Replica: "b", Store: store, Checkpoint: host.CheckpointOnDrain}, policy, files)
	logsOnFailure(t, a, b)
	rt := &router{to: a}
	// No standalone stream: the drain closes it at once, and its client,
	// reconnecting through this router to a, draining, would give up.
	tr := &mcp.StreamableClientTransport{Endpoint: a.srv.URL + "/mcp", HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}
	alice, err := mcp.NewClient(&mcp.Implementation{Name: "alice", Version: "1"}, nil).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alice.Close() })
	if res := call(t, alice, "note_add", map[string]any{"text": "alice's"}); res.IsError {
		t.Fatal(text(res))
	}

	bob := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	bctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go bob.CallTool(bctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
	eventually(t, "bob's spin to run", func() bool { return a.h.LiveInstancesByPlugin()["loop"] == 1 && a.h.BusyInstances() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a.h.Drain(ctx, host.DrainOptions{}) // fails: bob's call is still running
	a.waitLog(t, "drained", 1)
	rt.point(b)
	res := notes(t, alice, nil)
	if res.IsError || res.Meta[host.MetaStateReset] != nil || !strings.Contains(text(res), "alice's") {
		t.Fatalf("alice at b after a's drain, which bob's call outlasted: %v %s", res.Meta, text(res))
	}
	// a released her claim: b took it over from no one.
	if strings.Contains(b.log.String(), "holderAlive=true") {
		t.Fatalf("b took alice's session from a live holder")
	}
}

// heldBody is a request body that says, at its first read, that its
// handler has begun reading it.
type heldBody struct {
	io.ReadCloser
	once    sync.Once
	reading chan struct{}
}

func (b *heldBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	return b.ReadCloser.Read(p)
}

// TestSlowBodyHoldsNoTakeover: a client sending the body of a request
// with no session ID slowly (within the guard's body timeout, 30 s)
// holds up no other client. Bob's initialize, its body begun and held,
// is being read at b; alice's session, moved from a, is taken over at b,
// and carol opens a session there, meanwhile. A red team found the body
// read under adoptMu's read lock: alice's takeover waited for the write
// lock until bob's body ended, and carol's session, and every new one,
// behind it.
func TestSlowBodyHoldsNoTakeover(t *testing.T) {
	store := statestore.NewMemory()
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	a := replicaWith(t, host.Options{Replica: "a", Store: store}, sandbox.NewPolicy(), files)
	opts := host.Options{Replica: "b", Store: store, StateKey: replicaKey}
	fb := newFixture(t, &opts, sandbox.NewPolicy(), files)
	reading := make(chan struct{})
	inner := fb.h.HTTPHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Held") != "" {
			r.Body = &heldBody{ReadCloser: r.Body, reading: reading}
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	b := &replica{fixture: fb, name: "b", srv: srv}
	logsOnFailure(t, a, b)
	rt := &router{to: a}
	alice := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if res := call(t, alice, "note_add", map[string]any{"text": "alice's"}); res.IsError {
		t.Fatal(text(res))
	}

	// Bob's initialize at b: its headers and the body's first bytes,
	// the rest held.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nX-Held: 1\r\nContent-Length: 200\r\n\r\n{\"jsonrpc\":", srv.Listener.Addr())
	<-reading

	a.gone()
	rt.point(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "note_list", Arguments: map[string]any{}})
	if err != nil || res.IsError || !strings.Contains(text(res), "alice's") {
		t.Fatalf("alice's session at b while bob's body is held: %v", err)
	}
	carol, err := mcp.NewClient(&mcp.Implementation{Name: "carol", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("carol's new session at b while bob's body is held: %v", err)
	}
	carol.Close()
}

// TestResendHeaderIsTheHosts: X-Wasmtools-Resend, which carries from the
// HTTP layer to a call the digest of its POST (a proxy's resend of it is
// answered once), is the host's alone: a 2026-07-28 client sending it
// with two different calls of its handle gets both run. A review found
// it was stripped from a stateful session's requests only: the
// sessionless client's own value was taken as the call's at-most-once
// key (any length, past the 128 bytes of an idempotency key), and its
// second call was answered with the first's result, not run.
func TestResendHeaderIsTheHosts(t *testing.T) {
	f := newFixture(t, &host.Options{Store: statestore.NewMemory(), StateKey: replicaKey}, sandbox.NewPolicy(),
		map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cs := connectHTTP(t, serveHTTP(t, f), "", headerTransport{"X-Wasmtools-Resend", strings.Repeat("d", 4096)})
	cs.ListTools(context.Background(), nil)
	handle, _ := countWith(t, cs, "").Meta[host.MetaSession].(string)
	if res := countWith(t, cs, handle); text(res) != "2" {
		t.Fatalf("the second call of the handle, with the client's own resend header: %v %s; want it run, 2", res.Meta, text(res))
	}
}
