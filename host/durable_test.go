package host_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Regression tests of issue #25 (durable sessions never lose an
// acknowledged write).

// pair is replicas a and b of the notes example on stores sa and sb (one
// store seen through two wrappers, or the same), a router pointing at a,
// and a 2025-11-25 client through it; their logs are shown if the test
// fails.
func pair(t *testing.T, sa, sb statestore.Store) (a, b *replica, rt *router, cs *mcp.ClientSession) {
	t.Helper()
	a = newReplica(t, "a", sa, sandbox.NewPolicy())
	b = newReplica(t, "b", sb, sandbox.NewPolicy())
	rt = &router{to: a}
	cs = connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	logsOnFailure(t, a, b)
	return a, b, rt, cs
}

// A store that came back empty (a Redis restarted without persistence)
// is detected by its epoch: the replica holding a session writes back
// what it holds, the session's calls go on without "moved", and another
// replica takes the session over with every note. The old code answered
// every call "moved" and started the session empty.
func TestStoreBackEmptySessionGoesOn(t *testing.T) {
	store := statestore.NewMemory()
	a, b, rt, cs := pair(t, store, store)
	for _, n := range []string{"one", "two"} {
		if res := call(t, cs, "note_add", map[string]any{"text": n}); res.IsError {
			t.Fatal(text(res))
		}
	}
	store.Flush()
	res := call(t, cs, "note_add", map[string]any{"text": "three"})
	if res.IsError || !strings.Contains(text(res), "note 3 saved") || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("call after the store came back empty: %v %s", res.Meta, text(res))
	}
	a.waitLog(t, "state store lost the session's record", 1)
	a.gone()
	rt.point(b)
	list := text(notes(t, cs, nil))
	for _, n := range []string{"one", "two", "three"} {
		if !strings.Contains(list, n) {
			t.Fatalf("note %q lost after the store came back empty and the session moved:\n%s", n, list)
		}
	}
}

// A call whose state could not be saved says so in its result
// (_meta notSaved), rather than answering as if it were durable. The old
// code said nothing: the client's next call on another replica had lost
// it silently.
func TestNotSavedIsMarked(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	if res := call(t, cs, "note_add", map[string]any{"text": "kept"}); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a saved call: %v %s", res.Meta, text(res))
	}
	store.Close()
	res := call(t, cs, "note_add", map[string]any{"text": "not kept"})
	m, ok := res.Meta[host.MetaNotSaved].(map[string]any)
	if res.IsError || !ok || m["reason"] != "store-unavailable" {
		t.Fatalf("a call with the store gone: meta %v, %s; want notSaved store-unavailable", res.Meta, text(res))
	}
	// A resource read runs the guest too, and says the same (it said
	// nothing until stop 57).
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "notes://all"})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := rr.Meta[host.MetaNotSaved].(map[string]any); !ok || m["reason"] != "store-unavailable" {
		t.Errorf("a resource read with the store gone: meta %v; want notSaved store-unavailable", rr.Meta)
	}
}

// A 2025-11-25 client whose replica died while a call's stream was open
// resumes the stream (GET with Last-Event-ID) at another replica, which
// has none of its events: the call fails, the session goes on. The old
// code turned the resumption into a second standalone stream: 409, and
// the go-sdk client closed the session.
func TestResumedStreamAtAnotherReplicaKeepsSession(t *testing.T) {
	store := statestore.NewMemory()
	files := map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")}
	a := newReplicaOf(t, "a", store, sandbox.NewPolicy(), files)
	b := newReplicaOf(t, "b", store, sandbox.NewPolicy(), files)
	rt := &router{to: a}
	var once sync.Once
	answer := func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		once.Do(func() { rt.point(b); a.srv.CloseClientConnections(); go a.gone() }) // a dies while the person thinks
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}, nil
	}
	cs := connectHTTPEra(t, a.srv.URL, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: answer}, rt)
	logsOnFailure(t, a, b)
	h := handleOf(call(t, cs, "add", map[string]any{"item": "milk"}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs.CallTool(ctx, &mcp.CallToolParams{Name: "delete", Arguments: map[string]any{"item": "milk", host.SessionArgument: h}})
	// Whatever the interrupted call says, the session goes on at b.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list", Arguments: map[string]any{host.SessionArgument: h}})
	if err != nil {
		t.Fatalf("the session after its stream was resumed at b: %v", err)
	}
	if res.IsError {
		t.Fatalf("list at b: %s", text(res))
	}
}

// At most once: a proxy's resend of a tools/call POST that completed
// (the replica died between its checkpoint and its answer) reaches
// another replica, which answers with the first result instead of
// running the call again; so does a client's retry with the same
// idempotency key. The old code applied the call twice.
func TestCallAppliedAtMostOnce(t *testing.T) {
	store := statestore.NewMemory()
	a, b, rt, cs := pair(t, store, store)
	body := `{"jsonrpc":"2.0","id":1000,"method":"tools/call","params":{"name":"note_add","arguments":{"text":"once"}}}`
	status, first := postSession(t, a.srv.URL, cs.ID(), body)
	if status != http.StatusOK || !strings.Contains(first, "note 1 saved") {
		t.Fatalf("first POST: %d %s", status, first)
	}
	a.gone()
	rt.point(b)
	status, again := postSession(t, b.srv.URL, cs.ID(), body)
	if status != http.StatusOK || !strings.Contains(again, "note 1 saved") {
		t.Fatalf("the resent POST at b: %d %s; want the first result, note 1 saved", status, again)
	}
	if n := strings.Count(text(notes(t, cs, nil)), "once"); n != 1 {
		t.Fatalf("the resent call was applied %d times", n)
	}
	// A client's retry with an idempotency key.
	retry := func() *mcp.CallToolResult {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add",
			Arguments: map[string]any{"text": "keyed"}, Meta: mcp.Meta{host.MetaIdempotencyKey: "k-1"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	r1, r2 := retry(), retry()
	if text(r1) != text(r2) || !strings.Contains(text(r1), "note 2 saved") {
		t.Fatalf("keyed call and its retry: %q, %q", text(r1), text(r2))
	}
	if n := strings.Count(text(notes(t, cs, nil)), "keyed"); n != 1 {
		t.Fatalf("the keyed call was applied %d times", n)
	}
}

// A replica started with another WASMTOOLS_STATE_KEY than the store's is
// detected at start: it is not ready, and says why in /readyz and its
// log. The old code was ready, and lost every session that moved across
// it.
func TestStateKeyMismatchIsNotReady(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", statestore.Seal(store, []byte("the replicas' state key")), sandbox.NewPolicy())
	a.waitLog(t, "state key checked", 1)
	b := newReplica(t, "b", statestore.Seal(store, []byte("another state key")), sandbox.NewPolicy())
	b.waitLog(t, "state key mismatch", 1)
	for _, r := range []*replica{a, b} {
		res, err := http.Get(r.srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		want := http.StatusOK
		if r == b {
			want = http.StatusServiceUnavailable
		}
		if res.StatusCode != want || (r == b && !strings.Contains(string(body), "state key mismatch")) {
			t.Errorf("%s /readyz: %d %q", r.srv.URL, res.StatusCode, body)
		}
	}
}

// Finding 6: a session kept alive without calls (pings here; a person
// answering late, a task) keeps its record in the store past the TTL its
// last call set, and its instance. The old code renewed the record only
// on calls: it expired under the live session, and the next call
// started the notepad empty.
func TestLiveSessionKeepsItsRecord(t *testing.T) {
	store := statestore.NewMemory()
	a := replicaWith(t, host.Options{Replica: "a", Store: store, SessionTimeout: 6 * time.Second},
		sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	call(t, cs, "note_add", map[string]any{"text": "kept"})
	// Twice the TTL with pings only. Time passing is what is tested
	// (expiry has no event to wait on), as in statestore's afterTTL.
	end := time.Now().Add(13 * time.Second)
	for time.Now().Before(end) {
		if err := cs.Ping(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	if _, err := store.Get(context.Background(), "s."+cs.ID()); err != nil {
		t.Fatalf("the live session's record: %v", err)
	}
	if got := text(notes(t, cs, nil)); !strings.Contains(got, "kept") {
		t.Fatalf("notes after the TTL, kept alive by pings: %q", got)
	}
}

// failingStore is a store whose writes fail while failing is set, as a
// store that stopped answering does.
type failingStore struct {
	statestore.Store
	failing atomic.Bool
}

// errNoAnswer is failingStore's failure.
var errNoAnswer = errors.New("store not answering (test)")

func (s *failingStore) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	if s.failing.Load() {
		return errNoAnswer
	}
	return s.Store.Put(ctx, id, field, value, fence, ttl)
}

// down makes reads and claims fail too.
type downStore struct {
	failingStore
}

func (s *downStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	if s.failing.Load() {
		return statestore.Claim{}, errNoAnswer
	}
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

func (s *downStore) Get(ctx context.Context, id string) (map[string][]byte, error) {
	if s.failing.Load() {
		return nil, errNoAnswer
	}
	return s.Store.Get(ctx, id)
}

// Finding 10: a call whose checkpoint failed, then the loss of its
// instance (evicted for room): the client's next result must not roll
// back silently to the older stored state. The old code restored the
// older checkpoint and said nothing.
func TestNoSilentRollbackAfterFailedCheckpoint(t *testing.T) {
	store := &failingStore{Store: statestore.NewMemory()}
	f := newFixture(t, &host.Options{Store: store, StateKey: replicaKey, MaxInstances: 1}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	url := serveHTTP(t, f)
	a := connectHTTP(t, url, "2025-11-25", nil)
	b := connectHTTP(t, url, "2025-11-25", nil)
	call(t, a, "note_add", map[string]any{"text": "one"})
	store.failing.Store(true)
	res := call(t, a, "note_add", map[string]any{"text": "two"})
	if res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("a call whose checkpoint failed: %v %s", res.Meta, text(res))
	}
	store.failing.Store(false)
	call(t, b, "note_add", map[string]any{"text": "b's"}) // evicts a's instance
	f.waitLog(t, "instance evicted", 1)
	res = notes(t, a, nil)
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if !strings.Contains(text(res), "two") && (reset == nil || reset["reason"] != host.ReasonNotSaved) {
		t.Fatalf("a after its unsaved instance was evicted: %v %q; want note two, or stateReset not-saved", res.Meta, text(res))
	}
}

// A call served from memory while the store is away keeps its
// at-most-once key: its retry gets its first result, not a second run.
// The old code served it without its claim, so the key was neither looked
// up nor kept, and the retry added the note again.
func TestServedFromMemoryKeepsIdempotencyKey(t *testing.T) {
	store := &downStore{failingStore{Store: statestore.NewMemory()}}
	f := newFixture(t, &host.Options{Store: store, StateKey: replicaKey}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	cs := connectHTTP(t, serveHTTP(t, f), "2025-11-25", nil)
	call(t, cs, "note_add", map[string]any{"text": "one"})
	store.failing.Store(true)
	keyed := func() (*mcp.CallToolResult, error) {
		return cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add",
			Arguments: map[string]any{"text": "keyed"}, Meta: mcp.Meta{host.MetaIdempotencyKey: "k-down"}})
	}
	first, err := keyed()
	if err != nil {
		// Refused as unavailable: the claim was verified too long ago
		// on a loaded machine, so nothing was served from memory.
		t.Skipf("not served from memory: %v", err)
	}
	if first.Meta[host.MetaNotSaved] == nil || !strings.Contains(text(first), "note 2 saved") {
		t.Fatalf("a call served from memory: %v %q", first.Meta, text(first))
	}
	again, err := keyed()
	if err == nil && text(again) != text(first) {
		t.Fatalf("its retry: %q; want the first result, %q", text(again), text(first))
	}
	store.failing.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.h.WaitStore(ctx); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(text(notes(t, cs, nil)), "keyed"); n != 1 {
		t.Fatalf("the keyed call was applied %d times", n)
	}
}

// Finding 13: a question waiting for a 2025-11-25 client's answer does
// not hold Close to its grace: it is withdrawn, and the call ends. The
// old code waited until Close's context ended.
func TestCloseWithdrawsPendingQuestions(t *testing.T) {
	f := newFixture(t, &host.Options{}, sandbox.NewPolicy(), map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")})
	url := serveHTTP(t, f)
	p := newPending(t)
	answer := func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		p.wait(ctx)
		return nil, context.Canceled
	}
	cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: answer}, nil)
	t.Cleanup(p.release)
	h := handleOf(call(t, cs, "add", map[string]any{"item": "milk"}))
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "delete", Arguments: map[string]any{"item": "milk", host.SessionArgument: h}})
	<-p.asked
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.h.Close(ctx); err != nil {
		t.Fatalf("close with a question pending: %v", err)
	}
}

// withHeader adds a header to every request, as a gateway naming its
// client does (--client-header).
type withHeader struct {
	rt          http.RoundTripper
	name, value string
}

func (w withHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(w.name, w.value)
	return w.rt.RoundTrip(req)
}

// Finding 9: a --client-header client's first request at a replica
// while the store cannot be read is refused with the retryable -32053,
// not served from a fresh instance (which, once reads worked again,
// overwrote the stored state). The retry succeeds, with the state.
func TestUnreadableStateIsRefusedNotReset(t *testing.T) {
	store := &downStore{failingStore{Store: statestore.NewMemory()}}
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	serve := func(name string) *replica {
		return replicaWith(t, host.Options{Replica: name, Store: store, ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), files)
	}
	a, b := serve("a"), serve("b")
	rt := &router{to: a}
	hdr := withHeader{rt: rt, name: "X-Client", value: "c1"}
	cs := connectHTTP(t, a.srv.URL, "2026-07-28", hdr)
	call(t, cs, "note_add", map[string]any{"text": "kept"})
	// The client's next request reaches b, which never saw it, while the
	// store does not answer.
	store.failing.Store(true)
	rt.point(b)
	cs2 := connectHTTP(t, b.srv.URL, "2026-07-28", hdr)
	_, err := cs2.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: map[string]any{"text": "new"}})
	if err == nil || !strings.Contains(err.Error(), "-32053") && !strings.Contains(err.Error(), "state unavailable") {
		t.Fatalf("a call whose state cannot be read: %v; want the -32053 refusal\nb log:\n%s", err, b.log.String())
	}
	store.failing.Store(false)
	// The retry, once b asks the store again (its breaker closed).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.h.WaitStore(ctx); err != nil {
		t.Fatalf("b's breaker still open: %v", err)
	}
	res, err := cs2.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if err != nil || !strings.Contains(text(res), "kept") || strings.Contains(text(res), "new") {
		t.Fatalf("the retry: %v %q; want the stored note only", err, text(res))
	}
}

// hookStore runs hook (once) after the nth Get of id returns, or fails
// that Get when fail is set.
type hookStore struct {
	statestore.Store
	mu   sync.Mutex
	id   string
	n    int
	gets int
	fail bool
	hook func()
}

func (s *hookStore) arm(id string, n int, fail bool, hook func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id, s.n, s.gets, s.fail, s.hook = id, n, 0, fail, hook
}

func (s *hookStore) Get(ctx context.Context, id string) (map[string][]byte, error) {
	s.mu.Lock()
	fire := false
	if id == s.id {
		s.gets++
		fire = s.gets == s.n
	}
	fail, hook := s.fail, s.hook
	if fire {
		s.hook = nil
	}
	s.mu.Unlock()
	if fire && fail {
		return nil, errNoAnswer
	}
	rec, err := s.Store.Get(ctx, id)
	if fire && hook != nil {
		hook()
	}
	return rec, err
}

// Finding 3: a replica taking a session over claims it before it reads
// its record, so a write the old holder acknowledges meanwhile is either
// in what it reads or fenced (and the old holder's call fails): never
// acknowledged and then erased. The old code read first: the old
// holder's acknowledged note was lost.
func TestTakeoverClaimsBeforeReading(t *testing.T) {
	shared := statestore.NewMemory()
	atB := &hookStore{Store: shared}
	a, b, rt, cs := pair(t, shared, atB)
	call(t, cs, "note_add", map[string]any{"text": "one"})
	// b's second read of the session's record is the takeover's, by the
	// call's own claim (the first is the handshake's, for its replay);
	// right after it returns, a acknowledges a write, as a replica still
	// serving would.
	var between string
	atB.arm("s."+cs.ID(), 2, false, func() {
		_, between = postSession(t, a.srv.URL, cs.ID(), `{"jsonrpc":"2.0","id":500,"method":"tools/call","params":{"name":"note_add","arguments":{"text":"between"}}}`)
	})
	rt.point(b)
	// a took the session back during b's call, which is then told so
	// (its state moved, not saved) and tried again, as a client does.
	for attempt := 1; ; attempt++ {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: map[string]any{"text": "at b"}})
		if err == nil && !res.IsError {
			break
		}
		if attempt == 3 {
			t.Fatalf("note_add at b, attempt %d: %v %v", attempt, err, res)
		}
		t.Logf("note_add at b, attempt %d: %v %v", attempt, err, res)
	}
	acked := strings.Contains(between, "saved") && !strings.Contains(between, `"isError":true`) && !strings.Contains(between, "notSaved")
	list := text(notes(t, cs, nil))
	if acked && !strings.Contains(list, "between") {
		t.Fatalf("a acknowledged %q, and b lost it:\n%s", between, list)
	}
	if !strings.Contains(list, "one") || !strings.Contains(list, "at b") {
		t.Fatalf("notes at b:\n%s", list)
	}
}

// Finding 4: a replica that finds its session was served by another one
// since, and cannot read the record now, refuses the request (-32053)
// rather than serving its stale instance; the retry gets the other
// replica's writes. The old code adopted the new fence first: the stale
// instance was served, and never seeded again.
func TestStaleInstanceNotServedWhenRereadFails(t *testing.T) {
	shared := statestore.NewMemory()
	atA := &hookStore{Store: shared}
	a, b, rt, cs := pair(t, atA, shared)
	call(t, cs, "note_add", map[string]any{"text": "one"})
	rt.point(b)
	call(t, cs, "note_add", map[string]any{"text": "two at b"})
	rt.point(a)
	atA.arm("s."+cs.ID(), 1, true, nil) // a's re-read fails, once
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if err == nil && !strings.Contains(text(res), "two at b") {
		t.Fatalf("a served its stale instance: %q", text(res))
	}
	if err != nil && !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("the call at a whose re-read failed: %v; want served fresh or refused as unavailable", err)
	}
	// The retry, once a asks the store again (its breaker closed).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.h.WaitStore(ctx); err != nil {
		t.Fatalf("a's breaker still open: %v", err)
	}
	res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if err != nil || !strings.Contains(text(res), "two at b") {
		t.Fatalf("the retry at a: %v %q", err, text(res))
	}
}

// stallStore holds the next Put of the session named by hold until
// released, then fails it with its context's error: what a replica
// stopped (SIGSTOP) in the middle of an exchange sees when it is
// continued, its deadline long passed, though the store answered all
// along.
type stallStore struct {
	statestore.Store
	mu      sync.Mutex
	id      string
	entered chan struct{} // closed when the Put is held
	release chan struct{} // closed by the test: the process "continues"
}

func (s *stallStore) hold(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id = id
}

func (s *stallStore) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	s.mu.Lock()
	held := id == s.id
	if held {
		s.id = "" // once
	}
	s.mu.Unlock()
	if !held {
		return s.Store.Put(ctx, id, field, value, fence, ttl)
	}
	close(s.entered)
	<-s.release
	<-ctx.Done()
	return ctx.Err()
}

// Issue #25, sigstop-replica behind HAProxy: a replica continued after a
// stop finds the store exchanges it had in flight past their deadlines.
// Those timeouts are its own pause, not the store's: they must not open
// the breaker, or the replica serves "from memory" (marked notSaved) a
// session it verified a moment ago and another replica has taken over
// since, from its stale instance. The old code did: "note 51 saved" to a
// client with 53 notes, then hundreds of notSaved results it later lost.
func TestStalledExchangeDoesNotServeStaleInstance(t *testing.T) {
	shared := statestore.NewMemory()
	atA := &stallStore{Store: shared, entered: make(chan struct{}), release: make(chan struct{})}
	a, b := newReplica(t, "a", atA, sandbox.NewPolicy()), newReplica(t, "b", shared, sandbox.NewPolicy())
	logsOnFailure(t, a, b)
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	call(t, cs, "note_add", map[string]any{"text": "one"})
	// Another session's checkpoint at a is in flight when a "stops".
	other := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	call(t, other, "note_add", map[string]any{"text": "first"})
	atA.hold("s." + other.ID())
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		other.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: map[string]any{"text": "in flight"}})
	}()
	<-atA.entered
	begin := time.Now()
	// Late in the stall, the client's session is verified at a; then b
	// takes it over (the proxy failed a over) and acknowledges a note.
	time.Sleep(2*host.DefaultStoreTimeout - 500*time.Millisecond)
	call(t, cs, "note_list", nil)
	rt.point(b)
	if res := call(t, cs, "note_add", map[string]any{"text": "two at b"}); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("b: %v %s", res.Meta, text(res))
	}
	// a "continues": the held exchange ends more than its bound after its
	// deadline, and the session comes back to a within memoryGrace (2 s)
	// of a's verification.
	time.Sleep(time.Until(begin.Add(2*host.DefaultStoreTimeout + 300*time.Millisecond)))
	close(atA.release)
	<-stalled
	rt.point(a)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if err == nil && !strings.Contains(text(res), "two at b") {
		t.Fatalf("a served its stale instance after a stalled exchange: %v %q", res.Meta, text(res))
	}
	if err != nil || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a after a stalled exchange: %v %v; want the session read again from the store, not refused", err, res)
	}
}

// A sampling request waiting for a 2025-11-25 client is withdrawn at a
// drain, as a question is (TestCloseWithdrawsPendingQuestions): the call
// ends and its answer says so, and the drain does not wait out its
// deadline for the POST. It asked the client without the host knowing
// before stop 48, and only the sessions' close ended it.
func TestDrainWithdrawsPendingSampling(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	p := newPending(t)
	sample := func(ctx context.Context, _ *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
		p.wait(ctx)
		return nil, context.Canceled
	}
	cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{CreateMessageHandler: sample}, nil)
	t.Cleanup(p.release)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "hi"}})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "error: " + err.Error()}}}
		}
		done <- res
	}()
	<-p.asked
	drainPromptly(t, f, "a sampling request pending")
	select {
	case res := <-done:
		if !strings.Contains(text(res), "withdrawn") {
			t.Errorf("the sampling call's answer: %q; want the request said withdrawn", text(res))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sampling call did not end")
	}
}

// A 2026-07-28 client's stream of list changes (its subscriptions/listen
// POST, open until it leaves) is closed at a drain like a session's GET
// stream, and the drain does not wait for it.
func TestDrainClosesListenStream(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	copts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {}}
	cs := connectHTTPEra(t, url, "2026-07-28", copts, nil)
	call(t, cs, "count", nil)
	drainPromptly(t, f, "a client listening for list changes")
}

// drainPromptly drains f's host, failing the test if the drain fails or
// waits out its minute.
func drainPromptly(t *testing.T, f *fixture, with string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := f.h.Drain(ctx, host.DrainOptions{}); err != nil {
		t.Fatalf("drain with %s: %v", with, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the drain with %s waited out its deadline (%v)", with, time.Since(start))
	}
}

// pending is a client's handler of a request that a person would answer,
// for tests of requests withdrawn: wait closes asked, then returns when
// the request ends (ctx) or the test does.
type pending struct {
	asked, never chan struct{}
	release      func()
}

// newPending's handler returns at the test's end, or earlier once the
// test calls release: a test registers release as a cleanup after it
// connects its client, so that it runs before the client's Close (cleanups
// run last first), which waits for its handlers. A request withdrawn at
// a drain may never be cancelled at the client (the go-sdk sends its
// notifications/cancelled after the call's stream may have ended).
func newPending(t *testing.T) *pending {
	p := &pending{asked: make(chan struct{}), never: make(chan struct{})}
	p.release = sync.OnceFunc(func() { close(p.never) })
	t.Cleanup(p.release)
	return p
}

func (p *pending) wait(ctx context.Context) {
	close(p.asked)
	select {
	case <-p.never:
	case <-ctx.Done():
	}
}

// gateStore refuses every Put of the record named by refuse (as too
// large: a refusal, which opens no breaker), and holds the next Put of
// the record named by hold until released, then makes it.
type gateStore struct {
	statestore.Store
	mu      sync.Mutex
	refuse  string
	hold    string
	entered chan struct{}
	release chan struct{}
}

func (s *gateStore) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	s.mu.Lock()
	refused, held := id == s.refuse, id == s.hold
	if held {
		s.hold = ""
	}
	s.mu.Unlock()
	if refused {
		return statestore.ErrTooLarge
	}
	if held {
		close(s.entered)
		<-s.release
	}
	return s.Store.Put(ctx, id, field, value, fence, ttl)
}

// A reset the call's answer says is said again by the session's next
// call when the call's client went away while its state was saved (a
// checkpoint is made even so: it waits for the store), as it is when the
// client went away while the call ran: the answer reaches no one. The
// fault suite's kill9-mid-drain-calls with 32 clients per era (every
// replica starved of CPU, checkpoints seconds long, clients giving up on
// attempts after 5 s) read a list without the acknowledged notes and no
// stateReset: the reset went with an attempt its client had given up on
// during the checkpoint, counted as told before the result was sent.
func TestResetSaidAgainWhenClientLeftDuringCheckpoint(t *testing.T) {
	store := &gateStore{Store: statestore.NewMemory(), entered: make(chan struct{}), release: make(chan struct{})}
	f := newFixture(t, &host.Options{Replica: "a", Store: store, StateKey: replicaKey, MaxInstances: 1}, sandbox.NewPolicy(),
		map[string]string{"slownotes.wasm": testplugins.Test(t, "slownotes")})
	// gone is closed when the POST of the call that is to answer no one
	// has ended at the server (its client left).
	var (
		mu      sync.Mutex
		watch   bool
		gone    = make(chan struct{})
		goneSet sync.Once
	)
	h := f.h.HTTPHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		w8 := watch && r.Method == http.MethodPost
		watch = watch && !w8 // the call's POST alone, not the cancellation's after it
		mu.Unlock()
		if w8 {
			go func() { <-r.Context().Done(); goneSet.Do(func() { close(gone) }) }()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cs := connectHTTP(t, srv.URL, "2025-11-25", nil)
	other := connectHTTP(t, srv.URL, "2025-11-25", nil)
	add := func(cs *mcp.ClientSession, note string) *mcp.CallToolResult {
		t.Helper()
		return call(t, cs, "slow_add", map[string]any{"text": note, "steps": 0})
	}
	if res := add(cs, "one"); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("slow_add one: %v %s", res.Meta, text(res))
	}
	id := "s." + cs.ID()
	store.mu.Lock()
	store.refuse = id
	store.mu.Unlock()
	if res := add(cs, "two"); res.IsError || res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("slow_add two, its state refused by the store: %v %s; want acknowledged, marked not saved", res.Meta, text(res))
	}
	// Its instance evicted for another session's: the state the client
	// was told is gone with it, and the session's next call starts afresh,
	// said reset.
	add(other, "elsewhere")
	store.mu.Lock()
	store.refuse, store.hold = "", id
	store.mu.Unlock()
	mu.Lock()
	watch = true
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_list", Arguments: map[string]any{}})
		done <- err
	}()
	<-store.entered // the call ran, said the reset, and waits for its checkpoint
	cancel()        // its client gives up on it
	<-done
	<-gone
	close(store.release)
	res := call(t, cs, "slow_list", map[string]any{})
	if res.IsError {
		t.Fatalf("slow_list: %v %s", res.Meta, text(res))
	}
	if res.Meta[host.MetaStateReset] == nil {
		t.Fatalf("slow_list after an attempt that said the reset to no one: %q, meta %v; want the reset said (one and two are gone)", text(res), res.Meta)
	}
	if strings.Contains(text(res), "one") {
		t.Fatalf("slow_list after the reset: %q", text(res))
	}
}
