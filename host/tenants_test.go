package host_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Tenants' tokens in these tests.
const aliceToken, bobToken = "alice-token-0123456789", "bob-token-0123456789"

// tenantTransport sends a subject's bearer token and, if name is set, a
// header.
type tenantTransport struct{ token, name, value string }

func (tt tenantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+tt.token)
	if tt.name != "" {
		r.Header.Set(tt.name, tt.value)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestParkedCallBoundToSubject: alice's call parks at a question; bob
// retries tools/call with alice's requestState and his own answer (issue
// 26: he answered her question and received her result, her session
// handle included). He is refused as an invalid state, and alice's call
// stays parked for her.
func TestParkedCallBoundToSubject(t *testing.T) {
	f := pdkhostFixture(t, nil)
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	copts := &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	alice := connectHTTPEra(t, url, "", copts, tenantTransport{token: aliceToken})
	bob := connectHTTPEra(t, url, "", copts, tenantTransport{token: bobToken})

	first, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 2}})
	if err != nil || first.RequestState == "" {
		t.Fatalf("alice's first round: %v %+v", err, first)
	}
	res, err := retry(bob, first.RequestState, accept("mallory"))
	if err == nil || !strings.Contains(err.Error(), "invalid request state") {
		t.Fatalf("bob with alice's request state: %v %+v; want refused as an invalid request state", err, res)
	}
	second, err := retry(alice, first.RequestState, accept("ann"))
	if err != nil || second.RequestState == "" {
		t.Fatalf("alice after bob's attempt: %v %+v; want her second round", err, second)
	}
	final, err := retry(alice, second.RequestState, accept("bo"))
	if err != nil {
		t.Fatal(err)
	}
	if got := text(final); !strings.HasPrefix(got, "accept:ann,accept:bo") {
		t.Errorf("alice's result = %q, want her own answers", got)
	}
}

// TestClientHeaderBoundToSubject: with --client-header, bob naming
// alice's header value runs on his own instance, not hers (issue 26: the
// key ignored the subject).
func TestClientHeaderBoundToSubject(t *testing.T) {
	f := newFixture(t, &host.Options{ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "", tenantTransport{aliceToken, "X-Client", "laptop"})
	alice2 := connectHTTP(t, url, "", tenantTransport{aliceToken, "X-Client", "laptop"})
	bob := connectHTTP(t, url, "", tenantTransport{bobToken, "X-Client", "laptop"})
	var got []string
	for _, cs := range []*mcp.ClientSession{alice, alice2, bob, alice} {
		got = append(got, text(call(t, cs, "count", nil)))
	}
	if strings.Join(got, ",") != "1,2,1,3" {
		t.Errorf("counts = %v; want 1,2,1,3 (alice's header value hers, bob's the same value his own)", got)
	}
}

// TestRecordLogSubject: the record log names the subject each call ran
// for, and none for the shared token.
func TestRecordLogSubject(t *testing.T) {
	var audit syncBuffer
	f := pdkhostFixture(t, &host.Options{RecordLog: &audit})
	const shared = "shared-token-0123456789"
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken}})
	call(t, connectHTTP(t, url, "", tenantTransport{token: aliceToken}), "record", map[string]any{"count": 1})
	call(t, connectHTTP(t, url, "", tenantTransport{token: shared}), "record", map[string]any{"count": 1})
	lines := strings.Split(strings.TrimSpace(audit.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"subject":"alice"`) || strings.Contains(lines[1], `"subject"`) {
		t.Errorf("record log:\n%s\nwant alice's call with her subject, the shared token's with none", audit.String())
	}
}

// as is the headers of a request by the bearer of token, with the client
// header X-Client: client if set.
func as(token, client string) http.Header {
	h := http.Header{"Authorization": {"Bearer " + token}}
	if client != "" {
		h.Set("X-Client", client)
	}
	return h
}

// TestTaskFairShares: clients without a subject, however many they are,
// share one small pool of tasks, and one subject holds at most its own
// share: each subject is then fully served (issue 26: 288 task requests
// from 16 unauthenticated sessions made every client, token holders
// included, get -32050 for an hour).
func TestTaskFairShares(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{MaxTasksPerClient: 2, MaxTasks: 8, MaxAnonymousTasks: 3, ClientKeyHeader: "X-Client", Tenants: true}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	start := func(h http.Header) bool {
		res, e := rpcWith(t, url, h, "tools/call", "slow_compute", map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 600}}, withTasks)
		if e != nil {
			if e["code"] != float64(host.CodeBusy) {
				t.Fatalf("refused with %v, want CodeBusy", e)
			}
			return false
		}
		return res["resultType"] == "task"
	}
	anonymous := 0
	for i := range 10 { // five anonymous clients, two tasks each
		if start(as(shared, fmt.Sprintf("anon-%d", i/2))) {
			anonymous++
		}
	}
	if anonymous != 3 {
		t.Errorf("anonymous clients got %d tasks, want the pool's 3", anonymous)
	}
	for _, tok := range []string{aliceToken, bobToken} {
		for i := range 2 {
			if !start(as(tok, "")) {
				t.Fatalf("subject %s's task %d refused after the anonymous flood; want its share served", tok[:5], i+1)
			}
		}
		if start(as(tok, "")) {
			t.Errorf("subject %s got a third task past its share of 2", tok[:5])
		}
	}
}

// TestTaskAbandonedQuestion: a task waiting in input_required for an
// answer that never comes fails after AbandonAfter, its call stopped, and
// its slot is the client's again (issue 26: it held the slot for the
// task's hour).
func TestTaskAbandonedQuestion(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTasksPerClient: 1, AbandonAfter: 2 * time.Second}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	id := startTask(t, url, "confirm_delete", map[string]any{"filename": "a.txt"})
	// Not waited for in input_required, which lasts only AbandonAfter:
	// the error says the question went unanswered.
	got := waitStatus(t, f, cs, id, "failed")
	if got.Error == nil || !strings.Contains(got.Error.Message, "abandoned: its questions were not answered") {
		t.Errorf("abandoned task: %+v, want an error saying its question was abandoned", got)
	}
	f.waitLog(t, "parked call abandoned", 1)                        // its guest stopped
	startTask(t, url, "slow_compute", map[string]any{"seconds": 0}) // the finished one makes room
}

// TestHandleFairShares: with --max-handles 8 (a share of 2 each), bob
// and the anonymous clients mint 20 handles each and pass each back once;
// alice's handle lives on, and she can still mint one (issue 26: minting
// 40 handles and passing each back once evicted a victim's handle in
// use, across subjects too).
func TestHandleFairShares(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{MaxHandles: 8, Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	alice.ListTools(context.Background(), nil) // the client mirrors the handle into its header once it knows the schema
	h := handleOf(countWith(t, alice, ""))
	if got := firstText(countWith(t, alice, h)); got != "2" {
		t.Fatalf("alice: count = %s, want 2", got)
	}
	for _, tok := range []string{bobToken, shared} {
		flooder := connectHTTP(t, url, "", tenantTransport{token: tok})
		flooder.ListTools(context.Background(), nil)
		for range 20 {
			if fh := handleOf(countWith(t, flooder, "")); fh != "" {
				countWith(t, flooder, fh)
			}
		}
	}
	if res := countWith(t, alice, h); res.IsError || firstText(res) != "3" {
		t.Errorf("alice's handle after the floods: isError=%v %q, want count 3", res.IsError, text(res))
	}
	if res := countWith(t, alice, ""); res.IsError || handleOf(res) == "" {
		t.Errorf("alice's new handle after the floods: %q", text(res))
	}
}

// TestUnreturnedHandleFairShares: alice's first call mints a handle
// (count 1); before she passes it back, bob makes 70 calls that never
// pass theirs back, past sessions.DefaultMaxUnreturned. Her next call
// with her handle counts 2: each tenant's unreturned handles are bounded
// apart, so bob's one-shot handles cost bob's instances, never her state
// (review: the oldest across all tenants were freed, hers first).
func TestUnreturnedHandleFairShares(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	alice.ListTools(context.Background(), nil) // the client mirrors the handle into its header once it knows the schema
	first := countWith(t, alice, "")
	h := handleOf(first)
	if firstText(first) != "1" || h == "" {
		t.Fatalf("alice's first call: %q, handle %q", text(first), h)
	}
	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
	bob.ListTools(context.Background(), nil)
	for range 70 {
		countWith(t, bob, "")
	}
	if res := countWith(t, alice, h); res.IsError || firstText(res) != "2" {
		t.Errorf("alice's second call with her handle after bob's 70 one-shot calls: count %q (meta %v); want 2", firstText(res), res.Meta)
	}
}

// TestGrantAnswersFairShares: alice denies grantask's network request
// in her session, and the denial is remembered ("denied earlier in this
// session"). With the book bounded at 64 sessions, bob then makes 64
// sessionless calls, each with a handle of its own (his client offers no
// elicitation: each is refused unasked). Alice's denial still holds and
// she is not asked again: the grant book is bounded per tenant, and frees
// a client's answers when its handle ends (review: 4096 sessions FIFO
// across everyone, handles never freed, so bob's 4096 calls pushed hers
// out; the test made them all until the bound became an option).
func TestGrantAnswersFairShares(t *testing.T) {
	const book = 64 // sessions' answers remembered; 4,096 by default
	f, srv, target := grantFixture(t, &host.Options{Tenants: true, MaxGrantSessions: book})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	a := &grantAnswerer{decisions: []string{"deny", "allow for this session"}}
	alice := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: a.handler}, tenantTransport{token: aliceToken})
	fetch := func(cs *mcp.ClientSession) string { return text(call(t, cs, "fetch", map[string]any{"url": srv.URL})) }
	fetch(alice)
	before := "host " + target + " was denied earlier in this session by the person using the client"
	if got := fetch(alice); !strings.Contains(got, before) || a.count() != 1 {
		t.Fatalf("alice's second fetch: %q, %d questions; want her denial remembered", got, a.count())
	}

	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken}) // 2026-07-28, no elicitation
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range book / 4 {
				if _, err := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"url": srv.URL}}); err != nil {
					t.Errorf("bob's worker %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()

	if got := fetch(alice); !strings.Contains(got, before) || a.count() != 1 {
		t.Errorf("alice's fetch after bob's calls: %q, %d questions; want her denial still remembered and no new question", got, a.count())
	}
}

// TestParkedFairShares: with MaxParked 8 (a share of 2 each), bob and
// the anonymous clients each leave 6 calls parked at a question; alice's
// calls still park, and she finishes hers.
func TestParkedFairShares(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := pdkhostFixture(t, &host.Options{MaxParked: 8, Tenants: true})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	copts := &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	ask := func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		return cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 2}})
	}
	for _, tok := range []string{bobToken, shared} {
		cs := connectHTTPEra(t, url, "", copts, tenantTransport{token: tok})
		parked := 0
		for range 6 {
			if res, err := ask(cs); err == nil && res.RequestState != "" {
				parked++
			}
		}
		if parked != 2 {
			t.Errorf("%s parked %d calls, want its share of 2", tok[:5], parked)
		}
	}
	alice := connectHTTPEra(t, url, "", copts, tenantTransport{token: aliceToken})
	var first *mcp.CallToolResult
	for i := range 2 {
		res, err := ask(alice)
		if err != nil || res.RequestState == "" {
			t.Fatalf("alice's call %d after the floods: %v %+v; want parked at its question", i+1, err, res)
		}
		first = res
	}
	second, err := retry(alice, first.RequestState, accept("ann"))
	if err != nil || second.RequestState == "" {
		t.Fatalf("alice's second round: %v", err)
	}
	if final, err := retry(alice, second.RequestState, accept("bo")); err != nil || !strings.HasPrefix(text(final), "accept:ann,accept:bo") {
		t.Fatalf("alice's result: %v %q", err, text(final))
	}
}

// TestParkedBytesFairShares: a parked call keeps its arguments (up to
// the body's 4 MiB) until its client answers, so parked calls are bounded
// in bytes as in number: 64 MiB in all by default, each tenant a
// quarter. Here the bound is a sixty-fourth of that, 1 MiB: bob parks
// calls of 48 KiB of arguments, and 5 park within his 256 KiB, the rest are
// refused as calls past the count are ("too many calls wait for a
// client's answer"), and alice's still parks. Bob finishing one gives its
// bytes back, once: one more of his parks, the next does not. (A red
// team: bounded by count alone, 256 parked calls of 4 MiB kept 1 GiB.)
// At the default bound, with calls of 3 MiB, the test took over 2
// minutes under -race on a loaded machine, 9 s a call; at 4 MiB, with
// calls of 192 KiB, a minute.
func TestParkedBytesFairShares(t *testing.T) {
	f := pdkhostFixture(t, &host.Options{Tenants: true, MaxParkedPerClient: 64, MaxParkedBytes: 1 << 20})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	copts := &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	pad := strings.Repeat("x", 3<<14)
	ask := func(cs *mcp.ClientSession) (*mcp.CallToolResult, bool) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 1, "pad": pad}})
		if err != nil {
			t.Fatalf("a call of 48 KiB of arguments: %v", err)
		}
		if res.RequestState == "" && !strings.Contains(text(res), "too many calls wait for a client's answer") {
			t.Errorf("a call not parked: %q, want refused as too many calls waiting", text(res))
		}
		return res, res.RequestState != ""
	}
	bob := connectHTTPEra(t, url, "", copts, tenantTransport{token: bobToken})
	var parked []*mcp.CallToolResult
	for range 8 {
		if res, ok := ask(bob); ok {
			parked = append(parked, res)
		}
	}
	if len(parked) != 5 {
		t.Fatalf("bob parked %d calls of 48 KiB of arguments each, want 5 within his share of 256 KiB", len(parked))
	}
	alice := connectHTTPEra(t, url, "", copts, tenantTransport{token: aliceToken})
	if _, ok := ask(alice); !ok {
		t.Fatal("alice's call while bob holds his share of parked bytes: not parked")
	}
	if res, err := retry(bob, parked[0].RequestState, accept("ann")); err != nil || !strings.HasPrefix(text(res), "accept:ann") {
		t.Fatalf("bob's answer to his first call: %v %+v", err, res)
	}
	if _, ok := ask(bob); !ok {
		t.Fatal("bob's call after one of his finished: not parked, want its bytes given back")
	}
	if _, ok := ask(bob); ok {
		t.Error("bob parked a 6th call after one finished, want its bytes given back once")
	}
}

// TestCallFairShares: with --max-instances 8 (a share of 2 calls in
// flight each), bob and the anonymous clients each start 4 long calls:
// 2 each run, the rest are refused with CodeBusy, and alice's call is
// served (before shares, their 8 busy instances left her none).
func TestCallFairShares(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{MaxInstances: 8, Tenants: true}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx, cancel := context.WithCancel(context.Background())
	// Before the clients close, which waits for their calls in flight.
	defer cancel()
	refused := make(chan error, 8)
	for _, tok := range []string{bobToken, shared} {
		cs := connectHTTP(t, url, "", tenantTransport{token: tok})
		for range 4 {
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_compute", Arguments: map[string]any{"seconds": 600}})
				if ctx.Err() == nil {
					refused <- err
				}
			}()
		}
	}
	for range 4 {
		if err := <-refused; rpcCode(err) != host.CodeBusy {
			t.Fatalf("a call past the share: %v, want CodeBusy", err)
		}
	}
	eventually(t, "the 4 calls within the shares to run", func() bool { return f.h.LiveInstances() >= 4 })
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	res, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "alice"}})
	if err != nil || res.IsError {
		t.Fatalf("alice's call while the others hold their shares: %v %+v", err, res)
	}
	select {
	case err := <-refused:
		t.Errorf("more than 4 calls refused: %v", err)
	default:
	}
}

// TestCallRateShares: CallsPerSecondPerSubject bounds each subject's call
// rate: bob's second call in the same 100 s is refused with CodeBusy,
// alice's first is served.
func TestCallRateShares(t *testing.T) {
	f := newFixture(t, &host.Options{CallsPerSecondPerSubject: 0.01}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
	call(t, bob, "count", nil)
	if _, err := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"}); rpcCode(err) != host.CodeBusy {
		t.Fatalf("bob's second call: %v, want CodeBusy", err)
	}
	call(t, connectHTTP(t, url, "", tenantTransport{token: aliceToken}), "count", nil)
}

// TestCallRateSharesCoverRequests: the subject's call bounds count every
// request that runs a guest, not tools/call alone: past bob's one call
// per 100 s, his resources/read (which runs notes' guest on an instance
// of his) is refused with CodeBusy, as his second tools/call is.
func TestCallRateSharesCoverRequests(t *testing.T) {
	f := newFixture(t, &host.Options{CallsPerSecondPerSubject: 0.01, Tenants: true}, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	call(t, bob, "note_list", map[string]any{}) // his one call this 100 s
	if _, err := bob.CallTool(ctx, &mcp.CallToolParams{Name: "note_list", Arguments: map[string]any{}}); rpcCode(err) != host.CodeBusy {
		t.Fatalf("bob's second tools/call: %v, want CodeBusy", err)
	}
	served := 0
	for range 50 {
		_, err := bob.ReadResource(ctx, &mcp.ReadResourceParams{URI: "notes://all"})
		switch {
		case err == nil:
			served++
		case rpcCode(err) != host.CodeBusy:
			t.Fatalf("bob's resources/read past his share: %v, want CodeBusy", err)
		}
	}
	if served > 0 {
		t.Errorf("bob, past his share of 1 call per 100 s, had %d of 50 resources/read served (each runs notes' guest)", served)
	}
}

// countingStore is a real store whose writes the test observes: the
// bytes of each record's fields as last written.
type countingStore struct {
	statestore.Store
	mu    sync.Mutex
	bytes map[string]map[string]int
}

func (c *countingStore) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	err := c.Store.Put(ctx, id, field, value, fence, ttl)
	if err == nil {
		c.mu.Lock()
		if c.bytes[id] == nil {
			c.bytes[id] = map[string]int{}
		}
		c.bytes[id][field] = len(value)
		c.mu.Unlock()
	}
	return err
}

// sizes are the sizes of field in the records that hold it.
func (c *countingStore) sizes(field string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, r := range c.bytes {
		if n, ok := r[field]; ok {
			out = append(out, n)
		}
	}
	return out
}

// TestStoreFairShares: each subject's sessions hold at most its share of
// the state store's bytes, and a session's MCP record at most 256 KiB
// (issue 26: 11 anonymous handles wrote 240 MiB, 30 bare initialize
// requests with 3 MiB capabilities 105 MiB). Bob's sessions past his
// share are not saved; alice's are.
func TestStoreFairShares(t *testing.T) {
	store := &countingStore{Store: statestore.NewMemory(), bytes: map[string]map[string]int{}}
	f := newFixture(t, &host.Options{Store: store, StateKey: replicaKey, StoreBytesPerTenant: 920, Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
	for range 5 {
		countWith(t, bob, "")
	}
	if n := len(store.sizes("p/counter")); n != 2 {
		t.Errorf("bob's 5 sessions: %d saved, want the 2 his share of 920 bytes holds (about 368 each)", n)
	}
	f.waitLog(t, "state store budget exceeded", 1)
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	for range 2 {
		countWith(t, alice, "")
	}
	if n := len(store.sizes("p/counter")); n != 4 {
		t.Errorf("after alice's 2 sessions: %d saved, want 4 (alice's share untouched by bob's)", n)
	}

	// A stateful session whose initialize carries 300 KiB of
	// capabilities: its record is refused, the session served all the
	// same from this replica.
	big := map[string]any{"padding": strings.Repeat("x", 300<<10)}
	cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{Experimental: big}}, tenantTransport{token: bobToken})
	call(t, cs, "count", nil)
	f.waitLog(t, "new session not kept", 1)
	if n := slices.Max(append(store.sizes("mcp"), 0)); n > 256<<10 {
		t.Errorf("a %d-byte MCP record was stored, over 256 KiB", n)
	}
}

// TestStoreBudgetSaysOverBudget: a call whose state a byte budget
// refused is marked notSaved "over-budget", not "store-unavailable" (a
// review: a subject over its share was told the store was down, and could
// not tell "your state is too big" from an outage). Bob's share holds two
// sessions of counter (about 368 bytes each); his third is refused, by
// the host's count (a memory store) and by Redis's (two replicas).
func TestStoreBudgetSaysOverBudget(t *testing.T) {
	reason := func(res *mcp.CallToolResult) any {
		m, _ := res.Meta[host.MetaNotSaved].(map[string]any)
		return m["reason"]
	}
	t.Run("host", func(t *testing.T) {
		f := newFixture(t, &host.Options{Store: statestore.NewMemory(), StateKey: replicaKey, StoreBytesPerTenant: 920, Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
		bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
		for i := range 3 {
			res := countWith(t, bob, "")
			if want := map[bool]any{true: nil, false: "over-budget"}[i < 2]; reason(res) != want {
				t.Errorf("bob's session %d: notSaved %v, want %v (meta %v)", i+1, reason(res), want, res.Meta)
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		urls, _ := redisReplicas(t, 1200)
		over := 0
		for _, url := range urls {
			bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
			for range 3 {
				switch r := reason(countWith(t, bob, "")); r {
				case nil:
				case "over-budget":
					over++
				default:
					t.Errorf("a session of bob's: notSaved %v, want none or over-budget", r)
				}
			}
		}
		if over < 4 {
			t.Errorf("bob's 6 sessions on 2 replicas: %d marked over-budget, want the 4 past his share", over)
		}
	})
}

// TestStoreSharesAttributeRequests: a session's record counts against
// its subject's share of the store whichever request writes it first.
// Alice opens four sessions by client header, each read first
// (resources/read, which writes the record) and then written (note_add):
// only two fit her share of 120 000 bytes (about 49 000 each), and the
// anonymous clients' pool, which has stored nothing, still takes its
// first session (before, alice's records were charged to it).
func TestStoreSharesAttributeRequests(t *testing.T) {
	const shared = "shared-token-0123456789"
	store := &countingStore{Store: statestore.NewMemory(), bytes: map[string]map[string]int{}}
	f := newFixture(t, &host.Options{Store: store, StateKey: replicaKey, StoreBytesPerTenant: 120_000, Tenants: true, ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	for i := range 4 {
		alice := connectHTTP(t, url, "", tenantTransport{aliceToken, "X-Client", fmt.Sprintf("alice-%d", i)})
		if _, err := alice.ReadResource(ctx, &mcp.ReadResourceParams{URI: "notes://all"}); err != nil {
			t.Fatal(err)
		}
		call(t, alice, "note_add", map[string]any{"text": "hello"})
	}
	if n := len(store.sizes("p/notes")); n > 2 {
		t.Errorf("alice's 4 sessions: %d saved, want at most the 2 her share of 120000 bytes holds (sizes %v)", n, store.sizes("p/notes"))
	}
	anon := connectHTTP(t, url, "", tenantTransport{shared, "X-Client", "anon"})
	before := len(store.sizes("p/notes"))
	if res := call(t, anon, "note_add", map[string]any{"text": "hello"}); len(store.sizes("p/notes")) == before {
		t.Errorf("the anonymous pool's first session, with nothing stored, was not saved: %s %v", text(res), res.Meta)
	}
}

// TestURLElicitationCompletions: a guest looping on
// notify_url_elicitation_completed, 1000 times with the ID its URL
// elicitation issued and 1000 with IDs it never issued, gets exactly one
// completion to the client: the issued ID, once (issue 26: 30 to 49
// thousand per call, forged IDs forwarded).
func TestURLElicitationCompletions(t *testing.T) {
	f := hyperFixture(t, "", false)
	var mu sync.Mutex
	var completed []string
	cs := connectKind(t, f, "", clientKind{"memory", "2025-11-25"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		ElicitationCompleteHandler: func(_ context.Context, r *mcp.ElicitationCompleteNotificationRequest) {
			mu.Lock()
			completed = append(completed, r.Params.ElicitationID)
			mu.Unlock()
		},
	})
	if got, _ := callText(t, cs, "url_flood", map[string]any{"count": 1000}); !strings.Contains(got, `"action":"accept"`) {
		t.Fatalf("url_flood: %s", got)
	}
	eventually(t, "the completion", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(completed) > 0
	})
	callText(t, cs, "now", nil) // after the flood's notifications
	f.waitLog(t, "URL elicitation completions dropped", 1)
	mu.Lock()
	defer mu.Unlock()
	if len(completed) != 1 || completed[0] != "flood-1" {
		t.Errorf("%d completions (first %q), want exactly one, flood-1", len(completed), completed[0])
	}
}

// TestPluginAccess: [plugins.hash] access = {subjects = ["alice"]}: alice
// lists and calls hash's tools; bob's list lacks them, and his call of
// one is refused exactly as a tool that does not exist; lists go out with
// cacheScope "private".
func TestPluginAccess(t *testing.T) {
	f := newFixture(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hash": {Subjects: []string{"alice"}}}}, sandbox.NewPolicy(), map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"hash.wasm":    testplugins.Example(t, "hash"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	names := func(cs *mcp.ClientSession) string {
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, tool := range res.Tools {
			n = append(n, tool.Name)
		}
		return strings.Join(n, ",")
	}
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
	if got := names(alice); !strings.Contains(got, "hash") || !strings.Contains(got, "count") {
		t.Errorf("alice lists %s, want hash's and counter's tools", got)
	}
	if got := names(bob); strings.Contains(got, "hash") || strings.Contains(got, "base64") || !strings.Contains(got, "count") {
		t.Errorf("bob lists %s, want counter's tools only", got)
	}
	if res := call(t, alice, "base64", map[string]any{"text": "hi"}); res.IsError {
		t.Errorf("alice's call of hash's tool: %s", text(res))
	}
	_, refused := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "base64", Arguments: map[string]any{"text": "hi"}})
	_, unknown := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{"text": "hi"}})
	if refused == nil || unknown == nil || rpcCode(refused) != rpcCode(unknown) ||
		strings.ReplaceAll(refused.Error(), "base64", "X") != strings.ReplaceAll(unknown.Error(), "no_such_tool", "X") {
		t.Errorf("bob's call of hash's tool: %v; want exactly as an unknown tool: %v", refused, unknown)
	}
	res, e := rpcWith(t, url, as(bobToken, ""), "tools/list", "", map[string]any{}, map[string]any{})
	if e != nil || res["cacheScope"] != "private" {
		t.Errorf("tools/list: %v %v; want cacheScope private", res["cacheScope"], e)
	}
}

// TestPluginAccessPromptsResources: a plugin's prompts and resources
// follow its access rule like its tools: listed only to who may use them,
// and a get or read outside the rule refused as an unknown name is.
func TestPluginAccessPromptsResources(t *testing.T) {
	f := newFixture(t, &host.Options{PluginAccess: map[string]host.AccessRule{"everything": {Subjects: []string{"alice"}}}}, sandbox.NewPolicy(), map[string]string{
		"everything.wasm": testplugins.Example(t, "everything"),
		"counter.wasm":    testplugins.Example(t, "counter"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	ap, err := alice.ListPrompts(ctx, nil)
	if err != nil || len(ap.Prompts) == 0 {
		t.Fatalf("alice's prompts: %v %v; want everything's", ap, err)
	}
	ar, err := alice.ListResources(ctx, nil)
	if err != nil || len(ar.Resources) == 0 {
		t.Fatalf("alice's resources: %v %v; want everything's", ar, err)
	}
	if bp, err := bob.ListPrompts(ctx, nil); err != nil || len(bp.Prompts) != 0 {
		t.Errorf("bob's prompts: %v %v; want none", bp, err)
	}
	if br, err := bob.ListResources(ctx, nil); err != nil || len(br.Resources) != 0 {
		t.Errorf("bob's resources: %v %v; want none", br, err)
	}
	if bt, err := bob.ListResourceTemplates(ctx, nil); err != nil || len(bt.ResourceTemplates) != 0 {
		t.Errorf("bob's resource templates: %v %v; want none", bt, err)
	}
	// None is an empty array on the wire, as the go-sdk sends it: a
	// client checking the result's schema (the TypeScript and Python
	// SDKs') refuses a null list.
	for method, field := range map[string]string{"prompts/list": "prompts", "resources/list": "resources", "resources/templates/list": "resourceTemplates"} {
		res, e := rpcWith(t, url, as(bobToken, ""), method, "", map[string]any{}, map[string]any{})
		if l, ok := res[field].([]any); e != nil || !ok || len(l) != 0 {
			t.Errorf("bob's %s: %q is %#v (error %v); want []", method, field, res[field], e)
		}
	}
	_, refused := bob.GetPrompt(ctx, &mcp.GetPromptParams{Name: ap.Prompts[0].Name})
	_, unknown := bob.GetPrompt(ctx, &mcp.GetPromptParams{Name: "no_such_prompt"})
	if refused == nil || unknown == nil || rpcCode(refused) != rpcCode(unknown) {
		t.Errorf("bob's get of everything's prompt: %v; want as an unknown prompt: %v", refused, unknown)
	}
	_, refused = bob.ReadResource(ctx, &mcp.ReadResourceParams{URI: ar.Resources[0].URI})
	_, unknown = bob.ReadResource(ctx, &mcp.ReadResourceParams{URI: "nosuch://resource"})
	if refused == nil || unknown == nil || rpcCode(refused) != rpcCode(unknown) {
		t.Errorf("bob's read of everything's resource: %v; want as an unknown resource: %v", refused, unknown)
	}
	if _, err := alice.ReadResource(ctx, &mcp.ReadResourceParams{URI: ar.Resources[0].URI}); err != nil {
		t.Errorf("alice's read of everything's resource: %v", err)
	}
}

// TestPluginAccessCompletion: completion/complete follows the access
// rules as prompts/get does. hyperstrict is alice's alone: bob's
// completion of its prompt is answered exactly as one of a prompt that
// does not exist, and no instance of hyperstrict is made for him (before,
// its complete export ran on an instance of his and he got its
// suggestions).
func TestPluginAccessCompletion(t *testing.T) {
	f := newFixture(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hyperstrict": {Subjects: []string{"alice"}}}}, sandbox.NewPolicy(), map[string]string{
		"hyperstrict.wasm": testplugins.Test(t, "hyperstrict"),
		"counter.wasm":     testplugins.Example(t, "counter"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	complete := func(cs *mcp.ClientSession, name string) ([]string, error) {
		res, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: name}, Argument: mcp.CompleteParamsArgument{Name: "topic", Value: ""}})
		if err != nil {
			return nil, err
		}
		return res.Completion.Values, nil
	}
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	if bp, err := bob.ListPrompts(ctx, nil); err != nil || len(bp.Prompts) != 0 {
		t.Fatalf("bob's prompts: %+v %v; want none (hyperstrict is alice's)", bp, err)
	}
	got, err := complete(bob, "strict_prompt")
	unknown, uerr := complete(bob, "no_such_prompt")
	if !slices.Equal(got, unknown) || (err == nil) != (uerr == nil) {
		t.Errorf("bob's completion of alice's plugin's prompt = %v (err %v); want exactly as an unknown prompt: %v (err %v)", got, err, unknown, uerr)
	}
	if n := f.h.LiveInstances(); n != 0 {
		t.Errorf("%d instances live after bob's completions; want none", n)
	}
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	if _, err := complete(alice, "strict_prompt"); err != nil || f.h.LiveInstances() != 1 {
		t.Errorf("alice's completion of her plugin's prompt: %v, %d instances live; want it run on one", err, f.h.LiveInstances())
	}
}

// TestPluginAccessSubscriptions: resources/subscribe follows the access
// rules. hostileupdate is alice's alone: bob's subscription to one of its
// URIs is refused exactly as one to a URI no plugin serves, and alice's
// calls that change it tell him nothing (before, he was told each time).
func TestPluginAccessSubscriptions(t *testing.T) {
	f := newFixture(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hostileupdate": {Subjects: []string{"alice"}}}}, sandbox.NewPolicy(), map[string]string{
		"hostileupdate.wasm": testplugins.Test(t, "hostileupdate"),
		"counter.wasm":       testplugins.Example(t, "counter"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	var mu sync.Mutex
	var got []string
	bob := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			mu.Lock()
			got = append(got, r.Params.URI)
			mu.Unlock()
		},
	}, tenantTransport{token: bobToken})
	if bt, err := bob.ListResourceTemplates(ctx, nil); err != nil || len(bt.ResourceTemplates) != 0 {
		t.Fatalf("bob's resource templates: %+v %v; want none", bt, err)
	}
	refused := bob.Subscribe(ctx, &mcp.SubscribeParams{URI: "flood://item/1"})
	unknown := bob.Subscribe(ctx, &mcp.SubscribeParams{URI: "nosuch://item/1"})
	if refused == nil || unknown == nil || rpcCode(refused) != rpcCode(unknown) {
		t.Errorf("bob's subscription to alice's plugin's resource: %v; want as to an unknown one: %v", refused, unknown)
	}
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	call(t, alice, "update_burst", map[string]any{})
	// A ping of bob's session is answered after everything sent to it
	// before: updates still on their way are counted too.
	if err := bob.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) > 0 {
		t.Errorf("bob, who may not use hostileupdate, was told %d times that its resource %q changed (alice's calls)", len(got), got[0])
	}
}

// TestAdoptedHandleKeepsItsTenant: alice's handle, minted on replica a,
// moves to replica b (a proxy's rule moved). On b, bob fills the open
// handles (--max-handles 4, a share of 8 each: the global bound binds
// first) and passes each of his back once. Alice's handle lives on, her
// count goes on from 3: a handle taken over from another replica joins
// its subject's group, as at its minting, so bob's handles evict only his
// own (review: it joined no group, whose handles anyone's may evict, and
// alice's, used once on b, went first).
func TestAdoptedHandleKeepsItsTenant(t *testing.T) {
	store := statestore.NewMemory()
	files := map[string]string{"counter.wasm": testplugins.Example(t, "counter")}
	tokens := host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}}
	replica := func(name string) string {
		f := newFixture(t, &host.Options{Replica: name, Store: store, StateKey: replicaKey, Tenants: true, MaxHandles: 4, MaxHandlesPerSubject: 8}, sandbox.NewPolicy(), files)
		return serveGuarded(t, f, tokens)
	}
	a, b := replica("a"), replica("b")
	onA := connectHTTP(t, a, "", tenantTransport{token: aliceToken})
	onA.ListTools(context.Background(), nil) // the client mirrors the handle into its header once it knows the schema
	h := handleOf(countWith(t, onA, ""))
	if got := firstText(countWith(t, onA, h)); got != "2" {
		t.Fatalf("alice on a: count = %s, want 2", got)
	}
	alice := connectHTTP(t, b, "", tenantTransport{token: aliceToken})
	alice.ListTools(context.Background(), nil)
	if res := countWith(t, alice, h); res.IsError || firstText(res) != "3" {
		t.Fatalf("alice's handle taken over by b: isError=%v %q, want count 3", res.IsError, text(res))
	}
	bob := connectHTTP(t, b, "", tenantTransport{token: bobToken})
	bob.ListTools(context.Background(), nil)
	for range 8 {
		if bh := handleOf(countWith(t, bob, "")); bh != "" {
			countWith(t, bob, bh)
		}
	}
	if res := countWith(t, alice, h); res.IsError || firstText(res) != "4" {
		t.Errorf("alice's handle on b after bob's handles: isError=%v %q, want count 4", res.IsError, text(res))
	}
}

// TestPluginBudgetsPerTenant: bob calls hostileflood's log_burst over and
// over, each call sending 20 log messages of 12 000 bytes, which keeps the
// plugin's log budget (256 KiB at once, then 64 KiB a second) empty. Alice's
// call of the same tool still gets the five messages a call may send at
// once (64 KiB) to her client: with tenants, each tenant has its own budget
// of each plugin (review: one budget per plugin across all tenants, so bob's
// calls silenced every other tenant's).
func TestPluginBudgetsPerTenant(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy(), map[string]string{"hostileflood.wasm": testplugins.Test(t, "hostileflood")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	connect := func(token string, got *atomic.Int64) *mcp.ClientSession {
		cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{LoggingMessageHandler: func(context.Context, *mcp.LoggingMessageRequest) { got.Add(1) }}, tenantTransport{token: token})
		if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	var aliceGot, bobGot atomic.Int64
	alice, bob := connect(aliceToken, &aliceGot), connect(bobToken, &bobGot)
	burst := func(cs *mcp.ClientSession) error {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "log_burst", Arguments: map[string]any{}})
		return err
	}
	stop := make(chan struct{})
	calls := make(chan int, 1)
	go func() {
		defer close(calls)
		for n := 1; ; n++ {
			if err := burst(bob); err != nil {
				t.Errorf("bob's call %d: %v", n, err)
				return
			}
			select {
			case <-stop:
				return
			case calls <- n:
			default:
			}
		}
	}()
	// Ten of bob's calls take 600 KB of log data: past the plugin's
	// burst, so a shared budget is empty from then on.
	for n := range calls {
		if n >= 10 {
			break
		}
	}
	err := burst(alice)
	close(stop)
	for range calls {
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Ping(context.Background(), nil); err != nil { // her late notifications counted too
		t.Fatal(err)
	}
	if n := aliceGot.Load(); n < 5 {
		t.Errorf("alice's call sent %d log messages to her client while bob's calls flooded (bob's client got %d); want the 5 a call may send at once", n, bobGot.Load())
	}
}

// TestPluginAccessSubscriptionsListen: the 2026-07-28 form of
// TestPluginAccessSubscriptions. Alice and bob each open a
// subscriptions/listen stream for flood://item/1, a resource of
// hostileupdate, which only alice may use. Alice's calls say it changed:
// her stream is told, bob's never is (the access middleware leaves the URI
// out of what bob's stream is acknowledged, and watchFilter drops updates
// to sessions that may not use the plugin).
func TestPluginAccessSubscriptionsListen(t *testing.T) {
	f := newFixture(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hostileupdate": {Subjects: []string{"alice"}}}}, sandbox.NewPolicy(), map[string]string{
		"hostileupdate.wasm": testplugins.Test(t, "hostileupdate"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	const uri = "flood://item/1"
	listen := func(token string) (*mcp.ClientSession, chan string) {
		told := make(chan string, 64)
		cs := connectHTTPEra(t, url, "2026-07-28", &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
				select {
				case told <- r.Params.URI:
				default:
				}
			},
		}, tenantTransport{token: token})
		// Subscribe returns when the stream ends (the client closes).
		go cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri})
		return cs, told
	}
	alice, aliceTold := listen(aliceToken)
	_, bobTold := listen(bobToken)
	// Alice's calls until her stream is told: the streams open
	// asynchronously, and bob's opened at about the same time as hers.
	deadline := time.Now().Add(30 * time.Second)
	for told := false; !told; {
		if time.Now().After(deadline) {
			t.Fatal("alice's subscriptions/listen stream was never told that flood://item/1 changed")
		}
		call(t, alice, "update_burst", map[string]any{})
		select {
		case got := <-aliceTold:
			told = got == uri
		case <-time.After(time.Second):
		}
	}
	// Once more, after which anything sent to bob has had time to arrive
	// as alice's did.
	call(t, alice, "update_burst", map[string]any{})
	select {
	case <-aliceTold:
	case <-time.After(30 * time.Second):
		t.Fatal("alice's stream was not told of the last update")
	}
	select {
	case got := <-bobTold:
		t.Errorf("bob, who may not use hostileupdate, was told on his subscriptions/listen stream that %q changed", got)
	default:
	}
}

// TestWatchFilterAfterReload: bob subscribes to flood://item/1 while the
// plugin serving it is "open" (hostileupdate's code under another name),
// which he may use, and is told when alice's call says it changed. A
// reload then serves the URI from hostileupdate, which only alice may
// use: the go-sdk still holds bob's subscription, but alice's updates
// reach only her (watchFilter checks each update against the catalogue as
// it is then). A marker, an update of the everything example's resource
// that bob may watch, sent after them to his session's stream, says that
// anything sent to him before it has arrived.
func TestWatchFilterAfterReload(t *testing.T) {
	code := testplugins.Bytes(t, testplugins.Test(t, "hostileupdate"))
	f := newReloadFixtureWith(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hostileupdate": {Subjects: []string{"alice"}}}}, map[string][]byte{
		"open.wasm":       code,
		"everything.wasm": testplugins.Bytes(t, testplugins.Example(t, "everything")),
	})
	url := serveGuarded(t, f.fixture, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	const uri, marker = "flood://item/1", "test://watched-resource"
	told := func(uris ...string) map[string]chan struct{} {
		chans := map[string]chan struct{}{}
		for _, u := range uris {
			chans[u] = make(chan struct{}, 100)
		}
		return chans
	}
	subscribe := func(token string, chans map[string]chan struct{}) *mcp.ClientSession {
		cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
				if c, ok := chans[r.Params.URI]; ok {
					c <- struct{}{}
				}
			},
		}, tenantTransport{token: token})
		for u := range chans {
			if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: u}); err != nil {
				t.Fatal(err)
			}
		}
		return cs
	}
	// receive waits for n notifications on c.
	receive := func(c chan struct{}, n int, what string) {
		t.Helper()
		for i := range n {
			select {
			case <-c:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: %d of %d updates in 30 s", what, i, n)
			}
		}
	}
	bob := told(uri, marker)
	subscribe(bobToken, bob)
	alice := subscribe(aliceToken, told())
	call(t, alice, "update_burst", map[string]any{}) // ten updates of uri, by open
	receive(bob[uri], 10, "bob, of open's updates, which he may use")
	if err := os.Remove(filepath.Join(f.dir, "open.wasm")); err != nil {
		t.Fatal(err)
	}
	f.deploy(t, "hostileupdate.wasm", code)
	aliceTold := told(uri)
	alice = subscribe(aliceToken, aliceTold)
	call(t, alice, "update_burst", map[string]any{}) // now by hostileupdate
	call(t, alice, "test_update_watched_resource", map[string]any{})
	receive(aliceTold[uri], 10, "alice, of hostileupdate's updates")
	receive(bob[marker], 1, "bob, of the marker")
	if n := len(bob[uri]); n > 0 {
		t.Errorf("bob was told %d times that %s changed after the reload gave it to hostileupdate, which he may not use", n, uri)
	}
}

// TestStatelessPoolsPerTenant: the counter example, declared stateless
// (which it is not: as a plugin lying in its wasmtools.stateless section
// would), is served from warm pools. Alice counts 1, 2, 3 on the pooled
// instance; bob's first call counts 1, not 4: each tenant's requests take
// instances from a pool of its own (review: one pool per plugin passed
// alice's instance, and what it kept, to bob's call).
func TestStatelessPoolsPerTenant(t *testing.T) {
	f := newFixtureWith(t, &host.Options{Tenants: true}, func(string) plugins.Options {
		pol := sandbox.NewPolicy()
		return plugins.Options{Policy: &pol, Stateless: true}
	}, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "", tenantTransport{token: aliceToken})
	bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
	for want := 1; want <= 3; want++ {
		if got := firstText(call(t, alice, "count", nil)); got != strconv.Itoa(want) {
			t.Fatalf("alice's count %s, want %d: the pooled instance was not reused", got, want)
		}
	}
	if got := firstText(call(t, bob, "count", nil)); got != "1" {
		t.Errorf("bob's first count on the stateless counter is %s, want 1: an instance of alice's pool served him", got)
	}
	if got := firstText(call(t, alice, "count", nil)); got != "4" {
		t.Errorf("alice's count after bob's %s, want 4", got)
	}
}

// TestRootsNotificationsAdmitted: a roots notification runs a guest (each
// v2 plugin's on_roots_list_changed on the client's instance), so it is
// admitted against its subject's shares as a call is. A review found bob,
// past his share of one call per 100 s (his second tools/call refused),
// still running hyperstrict's guest once per notifications/roots/
// list_changed: the delivery leased the instance with no admission.
func TestRootsNotificationsAdmitted(t *testing.T) {
	f := newFixture(t, &host.Options{CallsPerSecondPerSubject: 0.01, Tenants: true}, sandbox.NewPolicy(), map[string]string{"hyperstrict.wasm": testplugins.Test(t, "hyperstrict")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	client := mcp.NewClient(&mcp.Implementation{Name: "bob", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: tenantTransport{token: bobToken}}}
	bob, err := client.Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bob.Close() })
	call(t, bob, "roots_changed", nil) // his one call this 100 s: his instance now lives
	if _, err := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "roots_changed"}); rpcCode(err) != host.CodeBusy {
		t.Fatalf("bob's second call: %v, want CodeBusy", err)
	}
	const (
		delivered = "on_roots_list_changed delivered"
		any       = "on_roots_list_changed"
	)
	for i := range 3 {
		client.AddRoots(&mcp.Root{URI: fmt.Sprintf("file:///r%d", i), Name: "r"})
		// Each notification ends in one log line, delivered or not.
		eventually(t, fmt.Sprintf("notification %d handled", i+1), func() bool { return strings.Count(f.log.String(), any) > i })
	}
	if n := strings.Count(f.log.String(), delivered); n > 0 {
		t.Errorf("bob, past his share of 1 call per 100 s (his tools/call refused CodeBusy), still ran hyperstrict's guest %d times with notifications/roots/list_changed", n)
	}
}

// TestResourceUpdatesStayWithTheirTenant: with Options.Tenants and no
// access rules, an update a plugin says of a resource goes only to the
// subscribed sessions of the tenant whose instance said it. A review
// found bob told of every change alice's calls made to her own instance
// (each client has its own: his did not change), a channel between
// tenants that told him when she acted. Alice's other session, of her
// tenant, hears them: it is what the test waits on before looking at bob.
func TestResourceUpdatesStayWithTheirTenant(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy(), map[string]string{
		"hostileupdate.wasm": testplugins.Test(t, "hostileupdate"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	const uri = "flood://item/1"
	watcher := func(token string, n *atomic.Int32) *mcp.ClientSession {
		cs := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
				if r.Params.URI == uri && r.Params.Meta == nil {
					n.Add(1)
				}
				activity.fire()
			},
		}, tenantTransport{token: token})
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	var bobHeard, aliceHeard atomic.Int32
	bob := watcher(bobToken, &bobHeard)
	watcher(aliceToken, &aliceHeard)
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	call(t, alice, "update_burst", map[string]any{})
	eventually(t, "alice's other session told of her 10 updates, its host's tag taken out", func() bool { return aliceHeard.Load() == 10 })
	if err := bob.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if n := bobHeard.Load(); n > 0 {
		t.Errorf("bob (another tenant, whose instance never ran) was told %d times that %q changed, by alice's calls on her own instance", n, uri)
	}
}

// TestURLCompletionBudgetPerTenant: the pace of a plugin's URL
// elicitation completions (32 at once, then 4 a second) is each tenant's,
// as its host functions' budgets are. A review found one budget per
// plugin for every tenant: alice's completions of her own IDs used it
// up, and bob's one completion, of an ID his own session issued, was
// dropped.
func TestURLCompletionBudgetPerTenant(t *testing.T) {
	f := newFixtureWith(t, &host.Options{Tenants: true}, func(string) plugins.Options {
		pol := sandbox.NewPolicy()
		return plugins.Options{Policy: &pol}
	}, map[string]string{"hyperhost.wasm": testplugins.Test(t, "hyperhost")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	connect := func(token string, got *atomic.Int64) *mcp.ClientSession {
		return connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{
			Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept"}, nil
			},
			ElicitationCompleteHandler: func(context.Context, *mcp.ElicitationCompleteNotificationRequest) {
				got.Add(1)
				activity.fire()
			},
		}, tenantTransport{token: token})
	}
	var aliceGot, bobGot atomic.Int64
	alice, bob := connect(aliceToken, &aliceGot), connect(bobToken, &bobGot)
	for range 40 {
		call(t, alice, "url_flood", map[string]any{"count": 1})
	}
	if n := aliceGot.Load(); n >= 40 {
		t.Fatalf("alice's 40 completions all sent (%d): the test's premise, that they pass the plugin's burst of 32, is wrong", n)
	}
	call(t, bob, "url_flood", map[string]any{"count": 1})
	// Each url_flood call also completes its ID again, which is dropped
	// whoever's budget it is: the log says nothing of bob's first one, so
	// the test waits for it to reach him.
	eventually(t, "bob's completion of his own URL elicitation (dropped if alice's calls used up his budget)", func() bool { return bobGot.Load() > 0 })
}

// TestRelistWithTenantsReadsFreshInstance: with Options.Tenants, a
// plugin that says its lists changed has them read from a new instance,
// not the caller's: what one tenant's calls did to its own instance is
// not every tenant's catalogue. A review found alice's relister_add (a
// tool added to her session's guest) listed to bob, and bob told the
// list changed; a tool of everyone's could be dropped the same way. And
// relists past the plugin's rate are put off, folded into one, not
// dropped, so that one tenant asking often never keeps a change from
// being served to another.
func TestRelistWithTenantsReadsFreshInstance(t *testing.T) {
	f := newReloadFixtureWith(t, &host.Options{Tenants: true}, map[string][]byte{"relister.wasm": testplugins.Bytes(t, testplugins.Test(t, "relister"))})
	url := serveGuarded(t, f.fixture, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx := context.Background()
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	before, err := bob.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	for i := range 8 { // past the burst of 5
		call(t, alice, "relister_add", map[string]any{"name": fmt.Sprintf("alice_secret_%d", i)})
	}
	// The relist runs before the call's result is sent: the catalogue is
	// what it will be.
	after, err := bob.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range after.Tools {
		if strings.HasPrefix(tool.Name, "alice_secret") {
			t.Errorf("bob lists %q, a tool that exists only in alice's session's instance", tool.Name)
		}
	}
	if len(after.Tools) != len(before.Tools) {
		t.Errorf("bob lists %d tools after alice's calls, %d before", len(after.Tools), len(before.Tools))
	}
	if n := strings.Count(f.log.String(), "reported too often"); n > 0 {
		t.Errorf("%d relists dropped past the rate; want them put off", n)
	}
}

// TestPerPluginBoundsShared: each tenant's calls in flight of one plugin
// are bounded by a quarter of that plugin's instance bound
// (MaxInstancesPerPlugin, InstanceLimits), not only by a quarter of the
// server's (MaxInstances, MaxConcurrentCalls). A review found, with
// --max-instances 64 (a share of 16 calls) and --max-instances-per-plugin
// 4, bob's 4 long calls of everything holding every instance the plugin
// may have, and alice's call of it refused.
func TestPerPluginBoundsShared(t *testing.T) {
	f := newFixture(t, &host.Options{MaxInstances: 64, MaxInstancesPerPlugin: 4, Tenants: true}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused := make(chan error, 4)
	for range 4 {
		cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
		go func() {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_compute", Arguments: map[string]any{"seconds": 600}})
			if rpcCode(err) == host.CodeBusy {
				refused <- err
			}
		}()
	}
	// His share of the plugin's 4 instances is 1: three calls refused.
	for range 3 {
		select {
		case <-refused:
		case <-time.After(30 * time.Second):
			t.Fatalf("bob's 4 calls of a plugin bound to 4 instances: fewer than 3 refused, want 3 (his share is 1)")
		}
	}
	eventually(t, "bob's one call to run", func() bool { return f.h.LiveInstances() >= 1 })
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	res, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "alice"}})
	if err != nil {
		t.Errorf("alice's call while bob's call runs: %v; want served", err)
	} else if res.IsError {
		t.Errorf("alice's call while bob's call runs: %s; want served", text(res))
	}
}

// TestSessionFairShares: with MaxSessions 8, each tenant may hold 2 open
// stateful HTTP sessions. bob's third session ends one of his own idle
// ones (the one that never made a request, though his other is older);
// the anonymous pool's likewise; alice's session lives through both, her
// count going on. With both of bob's sessions serving a call, his next
// initialize is refused with CodeBusy, and alice still opens a second.
// Until stop 63 nothing bounded the sessions: one client could open them
// until the memory ran out, each living until the session timeout.
func TestSessionFairShares(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{MaxSessions: 8, Tenants: true}, sandbox.NewPolicy(), map[string]string{
		"counter.wasm":    testplugins.Example(t, "counter"),
		"everything.wasm": testplugins.Example(t, "everything"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	const stateful = "2025-11-25"
	greet := func(cs *mcp.ClientSession) error {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "x"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("%s", text(res))
		}
		return err
	}
	alice := connectHTTP(t, url, stateful, tenantTransport{token: aliceToken})
	if got := text(call(t, alice, "count", nil)); got != "1" {
		t.Fatalf("alice: count = %s, want 1", got)
	}
	b1 := connectHTTP(t, url, stateful, tenantTransport{token: bobToken})
	if err := greet(b1); err != nil {
		t.Fatal(err)
	}
	b2 := connectHTTP(t, url, stateful, tenantTransport{token: bobToken}) // never used
	b3 := connectHTTP(t, url, stateful, tenantTransport{token: bobToken})
	if err := greet(b2); err == nil {
		t.Errorf("bob's unused session served after his third opened; want it ended")
	}
	if err := greet(b1); err != nil {
		t.Errorf("bob's used session after his third opened: %v", err)
	}
	for range 3 {
		connectHTTP(t, url, stateful, tenantTransport{token: shared})
	}
	if got := text(call(t, alice, "count", nil)); got != "2" {
		t.Errorf("alice: count = %s after the others' sessions, want 2", got)
	}
	// Both of bob's sessions busy: no idle one of his to end.
	ctx, cancel := context.WithCancel(context.Background())
	busy := f.h.BusyInstances()
	defer endCalls(t, f, cancel, busy)
	for _, cs := range []*mcp.ClientSession{b1, b3} {
		go cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow_compute", Arguments: map[string]any{"seconds": 600}})
	}
	eventually(t, "bob's two calls to run", func() bool { return f.h.BusyInstances() >= busy+2 })
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: tenantTransport{token: bobToken}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: stateful})
	if err == nil {
		cs.Close() // its stream would hold the test server open
	}
	if rpcCode(err) != host.CodeBusy {
		t.Errorf("bob's session past his share, both busy: %v, want CodeBusy", err)
	}
	connectHTTP(t, url, stateful, tenantTransport{token: aliceToken})
	if got := text(call(t, alice, "count", nil)); got != "3" {
		t.Errorf("alice: count = %s at the end, want 3", got)
	}
}

// TestMaxSessions: without tenants, the session past MaxSessions ends the
// idle session that made no request since it opened, else the least
// recently used; the others keep their state.
func TestMaxSessions(t *testing.T) {
	f := newFixture(t, &host.Options{MaxSessions: 3}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveHTTP(t, f)
	const stateful = "2025-11-25"
	a := connectHTTP(t, url, stateful, nil)
	call(t, a, "count", nil)
	b := connectHTTP(t, url, stateful, nil)
	c := connectHTTP(t, url, stateful, nil)
	call(t, c, "count", nil)
	d := connectHTTP(t, url, stateful, nil) // ends b, never used
	if _, err := b.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"}); err == nil {
		t.Errorf("b served after the fourth session opened; want it ended")
	}
	call(t, d, "count", nil)
	call(t, c, "count", nil)
	connectHTTP(t, url, stateful, nil) // ends a, used longest ago
	if _, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"}); err == nil {
		t.Errorf("a served after the fifth session opened; want it ended")
	}
	if got := text(call(t, c, "count", nil)); got != "3" {
		t.Errorf("c: count = %s, want 3", got)
	}
}

// TestHeaderClientsBounded: each --client-header value is a client the
// host keeps until the session timeout, so their number and size are
// bounded as session handles' are: each tenant holds at most its share
// (MaxHandlesPerSubject) and a new value past it ends the tenant's own
// least recently used idle client, never another's; a value longer than
// a handle's bound is refused. (A red team: nothing bounded them, and 400
// calls of bob's, each naming a value of 32 KiB of its own, kept 56 MiB
// of heap for the session timeout, 30 min.)
func TestHeaderClientsBounded(t *testing.T) {
	f := newFixture(t, &host.Options{ClientKeyHeader: "X-Client", Tenants: true, MaxHandles: 8, MaxHandlesPerSubject: 2}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	count := func(token, client string) (string, map[string]any) {
		t.Helper()
		res, e := rpcWith(t, url, as(token, client), "tools/call", "count", map[string]any{"name": "count", "arguments": map[string]any{}}, map[string]any{})
		if e != nil {
			return "", e
		}
		content, _ := res["content"].([]any)
		if len(content) != 1 {
			t.Fatalf("result %v: want one content block", res)
		}
		block, _ := content[0].(map[string]any)
		s, _ := block["text"].(string)
		return s, nil
	}
	mustCount := func(token, client, want string) {
		t.Helper()
		if got, e := count(token, client); e != nil || got != want {
			t.Errorf("%s's count as %.20q = %q, %v; want %s", token[:3], client, got, e, want)
		}
	}
	mustCount(aliceToken, "laptop", "1")
	mustCount(bobToken, "b0", "1")
	for i := 1; i <= 20; i++ {
		mustCount(bobToken, fmt.Sprintf("b%d", i), "1")
	}
	mustCount(bobToken, "b0", "1")       // bob's oldest idle client was his to end
	mustCount(aliceToken, "laptop", "2") // alice's was never his to end

	if _, e := count(bobToken, strings.Repeat("x", 300)); e == nil {
		t.Errorf("a 300-byte client header value was served; want it refused")
	}
	pad := strings.Repeat("x", 32<<10)
	before := liveHeap()
	for i := range 200 {
		count(bobToken, fmt.Sprintf("%d-%s", i, pad))
	}
	if grew := int64(liveHeap()) - int64(before); grew > 4<<20 {
		t.Errorf("200 client header values of 32 KiB kept %d bytes of heap; want under 4 MiB", grew)
	}
}

// TestSessionParamsBounded: a stateful HTTP session keeps its client's
// initialize parameters for its life (the go-sdk's InitializeParams), so
// what sessions keep of them is bounded in bytes as well as in number:
// each tenant a quarter of [host.SessionParamsBytes], a session counted
// at what its parameters cost decoded; past it a new session ends the
// tenant's own idle ones, and parameters over the share alone are
// refused. (A red team: 20 of bob's sessions, each opened by one
// initialize of 1.6 MB, a capability of 60 000 small objects, kept 757
// MiB of heap; his share of sessions is 1 024.) The bound is 4 MiB here,
// bob's share 1 MiB, so that initializes of some 10 KB show it: the
// default's share takes initializes of megabytes, seconds each to decode
// under the race detector.
func TestSessionParamsBounded(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true, MaxSessionParamsBytes: 4 << 20}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	// post sends one JSON-RPC message as token's, in session id ("" for
	// none), and returns the session's ID and the error it got, if any.
	post := func(token, id string, msg map[string]any) (string, map[string]any) {
		t.Helper()
		body, _ := json.Marshal(msg)
		req, _ := http.NewRequest(http.MethodPost, url+"/mcp", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		if id != "" {
			req.Header.Set("Mcp-Session-Id", id)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", map[string]any{"status": resp.StatusCode}
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				raw = []byte(d)
			}
		}
		var got struct {
			Error map[string]any `json:"error"`
		}
		json.Unmarshal(raw, &got)
		return resp.Header.Get("Mcp-Session-Id"), got.Error
	}
	initialize := func(token string, entries int) (string, map[string]any) {
		experimental := map[string]any{}
		for i := range entries {
			experimental[fmt.Sprint("k", i)] = map[string]any{"a": []any{1, "x", true}}
		}
		return post(token, "", map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
			"protocolVersion": "2025-11-25", "clientInfo": map[string]any{"name": "c", "version": "1"},
			"capabilities": map[string]any{"experimental": experimental},
		}})
	}
	var ids []string
	for range 20 { // each some 11 KB, counted some 370 KB (values 128 each)
		id, e := initialize(bobToken, 400)
		if e != nil || id == "" {
			t.Fatalf("bob's initialize: %v", e)
		}
		ids = append(ids, id)
	}
	live := 0
	for _, id := range ids {
		if _, e := post(bobToken, id, map[string]any{"jsonrpc": "2.0", "id": 2, "method": "ping"}); e == nil {
			live++
		}
	}
	if live > 4 {
		t.Errorf("bob's sessions of large initializes: %d of 20 live; want at most 4 (his quarter of MaxSessionParamsBytes), his oldest ended", live)
	}
	if _, e := initialize(bobToken, 2000); e == nil || e["code"] != float64(host.CodeBusy) {
		t.Errorf("bob's initialize counted 1.8 MB, over his share alone: %v; want refused with CodeBusy", e)
	}
	if id, e := initialize(aliceToken, 10); e != nil || id == "" {
		t.Errorf("alice's initialize after bob's: %v; want served", e)
	}
}

// TestRequestMetaBounded: a request that runs a guest keeps its _meta,
// decoded, while it runs and while it is parked for a person's answer
// (an hour at most), and passes it to the guest; what a _meta may cost
// kept is bounded, and a request over it refused before anything runs.
// (A red team: 16 of bob's 2026-07-28 calls, each parked at a question
// with 1.6 MB of client capabilities in its _meta, kept 1.1 GiB of heap;
// his share of parked calls is 64.) A _meta of 2 000 small objects, 50
// KB of JSON, costs some 1.8 MB kept: over the bound as surely, and
// decoded in a fraction of the time under the race detector.
func TestRequestMetaBounded(t *testing.T) {
	f := pdkhostFixture(t, &host.Options{Tenants: true})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	ask := func(token string, entries int) (map[string]any, map[string]any) {
		experimental := map[string]any{}
		for i := range entries {
			experimental[fmt.Sprint("k", i)] = map[string]any{"a": []any{1, "x", true}}
		}
		caps := map[string]any{"elicitation": map[string]any{}, "experimental": experimental}
		return rpcWith(t, url, as(token, ""), "tools/call", "ask", map[string]any{"name": "ask", "arguments": map[string]any{"rounds": 2}}, caps)
	}
	if res, e := ask(bobToken, 2000); e == nil || e["code"] != float64(jsonrpc.CodeInvalidParams) {
		t.Errorf("bob's call with a _meta counted 1.8 MB: %.200v %v; want refused with invalid params", res, e)
	}
	if res, e := ask(aliceToken, 10); e != nil || res["requestState"] == nil {
		t.Errorf("alice's call with an ordinary _meta: %.200v %v; want parked at its question", res, e)
	}
}

// TestHeaderClientsBoundedWithStore: the bound on --client-header clients
// holds with a state store too. There each new value's client is made by
// the store's claim (its state seeded from the record, or none) before
// its first lease, and the bound was checked only for a client the lease
// made: every one of bob's 21 values kept its client and instance.
func TestHeaderClientsBoundedWithStore(t *testing.T) {
	f := newFixture(t, &host.Options{ClientKeyHeader: "X-Client", Tenants: true, MaxHandles: 8, MaxHandlesPerSubject: 2,
		Store: statestore.NewMemory(), StateKey: replicaKey}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	count := func(token, client string) {
		t.Helper()
		if _, e := rpcWith(t, url, as(token, client), "tools/call", "count", map[string]any{"name": "count", "arguments": map[string]any{}}, map[string]any{}); e != nil {
			t.Fatalf("%s's count as %q: %v", token[:3], client, e)
		}
	}
	count(aliceToken, "laptop")
	for i := range 21 {
		count(bobToken, fmt.Sprintf("b%d", i))
	}
	// Alice's client and two of bob's (his share) keep an instance each.
	eventually(t, "bob's clients past his share to end", func() bool { return f.h.LiveInstances() <= 3 })
}

// TestPluginAccessDuringFirstLoad: a call that arrives before the first
// load, and waits for its tool (Options.Loaded), is held to the access
// rules of the catalogue it runs on. The rules were checked when it
// arrived, against the empty catalogue, which knows no tool to refuse:
// bob's call of hash's tool waited for it and ran.
func TestPluginAccessDuringFirstLoad(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	dir := testplugins.Folder(t, map[string]string{"hash.wasm": testplugins.Example(t, "hash")})
	reloader := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: []string{dir}})
	t.Cleanup(func() { reloader.Close(ctx) })
	loaded := make(chan struct{})
	f := &fixture{log: &syncBuffer{}, rt: rt}
	f.h = host.New(reloader, &host.Options{
		Logger:       newTestLogger(f.log),
		Loaded:       loaded,
		LoadWait:     time.Minute,
		PluginAccess: map[string]host.AccessRule{"hash": {Subjects: []string{"alice"}}},
	})
	t.Cleanup(func() { f.h.Close(ctx) })
	// Outermost: says when bob's call has reached the host, which the
	// load below then follows.
	arrived := make(chan struct{}, 1)
	f.h.Server().AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/call" {
				arrived <- struct{}{}
			}
			return next(ctx, method, req)
		}
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	// A stateful session: Server() is the server of that era.
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := bob.CallTool(ctx, &mcp.CallToolParams{Name: "base64", Arguments: map[string]any{"text": "hi"}})
		done <- outcome{res, err}
	}()
	<-arrived
	if _, errs := reloader.Load(ctx); len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	close(loaded)
	got := <-done
	if got.err == nil {
		t.Fatalf("bob's call of hash's tool during the first load ran: %s; want it refused as an unknown tool", text(got.res))
	}
	if !strings.Contains(got.err.Error(), `unknown tool "base64"`) {
		t.Errorf("bob's call of hash's tool during the first load: %v; want unknown tool", got.err)
	}
}

// TestRequestBodiesBounded: the request bodies read at once are bounded
// in bytes, in all and for each tenant (a quarter), before the go-sdk
// reads them: a request past its tenant's share waits briefly, then is
// refused with 503 and Retry-After, and the other tenants keep theirs.
// (A red team: the call shares apply only once the go-sdk has read and
// decoded a request, and nothing bounded how many bodies of up to 4 MiB
// it read at once: bob's 48 bodies of 3 MiB, their last byte held back,
// kept some 190 MiB of heap, and any number more would have.)
func TestRequestBodiesBounded(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	// The held bodies stay unfinished for as long as the test waits.
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}, BodyTimeout: 2 * time.Minute})
	addr := strings.TrimPrefix(url, "http://")
	const n, size = 48, 3 << 20
	// An initialize of many small values, as the go-sdk decodes them.
	var b strings.Builder
	b.WriteString(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","clientInfo":{"name":"c","version":"1"},"capabilities":{"experimental":{`)
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, `"k%d":[1,"x",true],`, i)
	}
	b.WriteString(`"end":[]}}}}`)
	body := []byte(b.String())
	before := liveHeap()
	var refused, answered atomic.Int32
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // last: the connections' cleanups end the writes
	for range n {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// All but the body's last byte: the server holds what it read
		// of it, waiting for the rest. Writing blocks once a refused
		// request's connection no longer reads, until it is closed.
		wg.Go(func() {
			fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n", addr, bobToken, len(body))
			conn.Write(body[:len(body)-1])
		})
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				return
			}
			resp.Body.Close()
			answered.Add(1)
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
				refused.Add(1)
			}
		}()
	}
	// Bob's share is a quarter of the default bound (64 MiB): five of his
	// bodies are read, the rest refused. Unbounded, every body is read
	// and the heap holds them all.
	const share = 16 << 20
	admitted := int32(share / len(body))
	var grown int64
	eventually(t, "bob's bodies past his share refused, or read all at once", func() bool {
		grown = int64(liveHeap()) - int64(before)
		return refused.Load() >= n-admitted || grown > 64<<20
	})
	grown = int64(liveHeap()) - int64(before)
	t.Logf("bob's %d held bodies of %d KiB: %d refused, the heap grew by %d MiB", n, len(body)>>10, refused.Load(), grown>>20)
	if grown > 48<<20 {
		t.Errorf("bob's %d bodies of %d KiB, held unfinished, keep %d MiB of heap (%d refused); want at most his share, 16 MiB, read at once", n, len(body)>>10, grown>>20, refused.Load())
	}
	if got := answered.Load(); got != n-admitted {
		t.Errorf("bob's unfinished bodies: %d answered (%d refused with 503 and Retry-After); want %d refused, %d read", got, refused.Load(), n-admitted, admitted)
	}
	if res, e := rpcWith(t, url, as(aliceToken, ""), "tools/list", "", map[string]any{}, map[string]any{}); e != nil || res["tools"] == nil {
		t.Errorf("alice's tools/list while bob's bodies are read: %.200v %v; want served", res, e)
	}
}

// storedSessions counts the records in the Redis at raw that hold field,
// and their fields' bytes (values in line and out of line).
func storedSessions(t *testing.T, raw *redis.Client, field string) (n, bytes int) {
	t.Helper()
	ctx := context.Background()
	keys, err := raw.Keys(ctx, "wt:{*}:rec").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		all, err := raw.HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := all["f:"+field]; ok {
			n++
		}
		for f, v := range all {
			name, ok := strings.CutPrefix(f, "f:")
			if !ok {
				continue
			}
			if _, far := all["o:"+name]; far {
				l, _ := raw.StrLen(ctx, strings.TrimSuffix(k, "rec")+"v:"+name).Result()
				bytes += int(l)
				continue
			}
			bytes += len(v)
		}
	}
	return n, bytes
}

// redisReplicas are two hosts of the counter example sharing one
// redis-server on loopback, as replicas behind a proxy do (each its own
// connection to it, tenants on, bob's share perTenant bytes), each served
// behind host.Guard; and a raw client of the server.
func redisReplicas(t *testing.T, perTenant int) (urls [2]string, raw *redis.Client) {
	t.Helper()
	rs, raw := redisReplicaSet(t, perTenant)
	return [2]string{rs[0].srv.URL, rs[1].srv.URL}, raw
}

// redisReplicaSet is redisReplicas, the replicas themselves.
func redisReplicaSet(t *testing.T, perTenant int) (rs [2]*replica, raw *redis.Client) {
	t.Helper()
	return redisReplicaSetWith(t, perTenant, nil)
}

// redisReplicaSetWith is redisReplicaSet, each replica's store (i 0 for
// a, 1 for b) passed through wrap if it is not nil.
func redisReplicaSetWith(t *testing.T, perTenant int, wrap func(i int, s statestore.Store) statestore.Store) (rs [2]*replica, raw *redis.Client) {
	t.Helper()
	addr := proxytest.StartRedis(t)
	for i, name := range []string{"a", "b"} {
		store := redisStore(t, addr)
		if wrap != nil {
			store = wrap(i, store)
		}
		rs[i] = guardedReplica(t, name, store, perTenant)
	}
	raw = redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	return rs, raw
}

// guardedReplica is replica name of the counter example on store, with
// tenants' shares of perTenant bytes of it, behind host.Guard with
// alice's and bob's tokens.
func guardedReplica(t *testing.T, name string, store statestore.Store, perTenant int) *replica {
	t.Helper()
	f := newFixture(t, &host.Options{Replica: name, Store: store, StateKey: replicaKey, StoreBytesPerTenant: perTenant, Tenants: true}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	srv := httptest.NewServer(host.Guard(f.h.HTTPHandler(), host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}}))
	t.Cleanup(srv.Close)
	return &replica{fixture: f, name: name, srv: srv}
}

// redisReplicaSetAtB is redisReplicaSet without tenant shares, b's store
// alone passed through wrap, whose store it returns too.
func redisReplicaSetAtB[S statestore.Store](t *testing.T, wrap func(statestore.Store) S) (rs [2]*replica, atB S) {
	t.Helper()
	rs, _ = redisReplicaSetWith(t, 0, func(i int, s statestore.Store) statestore.Store {
		if i == 0 {
			return s
		}
		atB = wrap(s)
		return atB
	})
	return rs, atB
}

// TestStoreFairSharesAcrossReplicas: a tenant's share of the state
// store's bytes holds across the replicas that share the store (a red
// team: the budgets were counted in each replica's memory, so with R
// replicas bob stored R times his share). Bob, with a share of 1200
// bytes (two sessions of counter), opens three sessions on each of two
// replicas: two are saved in all, not four; and alice's share is hers.
func TestStoreFairSharesAcrossReplicas(t *testing.T) {
	urls, raw := redisReplicas(t, 1200)
	for _, url := range urls {
		bob := connectHTTP(t, url, "", tenantTransport{token: bobToken})
		for range 3 {
			countWith(t, bob, "")
		}
	}
	if n, bytes := storedSessions(t, raw, "p/counter"); n > 2 || bytes > 1200 {
		t.Errorf("bob's 6 sessions on 2 replicas: %d saved, %d bytes stored; want at most the 2 his share of 1200 bytes holds", n, bytes)
	}
	alice := connectHTTP(t, urls[1], "", tenantTransport{token: aliceToken})
	before, _ := storedSessions(t, raw, "p/counter")
	countWith(t, alice, "")
	if n, _ := storedSessions(t, raw, "p/counter"); n != before+1 {
		t.Errorf("alice's first session: %d saved, want %d (her share untouched by bob's)", n, before+1)
	}

	// The store forgets bob's records (they expired, or were evicted;
	// or Redis came back empty): his share is his again, not refused
	// for good by counts of records gone.
	ctx := context.Background()
	for _, forget := range []func() error{
		func() error {
			keys, err := raw.Keys(ctx, "wt:{*}:rec").Result()
			if err == nil {
				err = raw.Del(ctx, keys...).Err()
			}
			return err
		},
		func() error { return raw.FlushAll(ctx).Err() },
	} {
		if err := forget(); err != nil {
			t.Fatal(err)
		}
		bob := connectHTTP(t, urls[0], "", tenantTransport{token: bobToken})
		countWith(t, bob, "")
		if n, _ := storedSessions(t, raw, "p/counter"); n != 1 {
			t.Errorf("bob's session after the store forgot his records: %d saved, want 1", n)
		}
	}
}

// TestNamesStayWithTheirSubjectAcrossReplicas: every name of alice's
// state, presented by bob to the replica that does not hold it (the one
// that would take it over from the store they share, a real
// redis-server), reaches nothing of hers: her stateful session's ID in a
// call, a GET stream (resumed from an event ID or not) and a DELETE (404,
// as for a session unknown, and the session lives on), and her session
// handle (refused, nothing run, a handle of his own offered). Alice herself then goes on
// at that replica with both.
func TestNamesStayWithTheirSubjectAcrossReplicas(t *testing.T) {
	urls, _ := redisReplicas(t, 0)
	alice := connectHTTP(t, urls[0], "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, alice, "")
	do := func(method, token, body string, header ...string) (int, string) {
		t.Helper()
		// A stream served to bob would stay open: its read ends here.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, urls[1]+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", alice.ID())
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+token)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			return res.StatusCode, fmt.Sprintf("%s (%v)", b, err)
		}
		return res.StatusCode, string(b)
	}
	callBody := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{}}}`
	for _, c := range []struct {
		name, method, body string
		header             []string
	}{
		{"call", http.MethodPost, callBody, nil},
		{"stream", http.MethodGet, "", nil},
		{"resumed stream", http.MethodGet, "", []string{"Last-Event-ID", "0_0"}},
		{"delete", http.MethodDelete, "", nil},
	} {
		code, body := do(c.method, bobToken, c.body, c.header...)
		if code/100 == 2 && body != "" || code != http.StatusNotFound && code/100 != 2 {
			t.Errorf("bob's %s with alice's session ID at b: %d %q; want 404 (or an empty stream)", c.name, code, body)
		}
	}
	if code, body := do(http.MethodPost, aliceToken, callBody); code != http.StatusOK || !strings.Contains(body, `"text":"2"`) {
		t.Fatalf("alice's session at b after bob's attempts: %d %s; want her count, 2", code, body)
	}

	// Handles (2026-07-28).
	aliceA := connectHTTP(t, urls[0], "", tenantTransport{token: aliceToken})
	aliceA.ListTools(context.Background(), nil)
	res := countWith(t, aliceA, "")
	handle, _ := res.Meta[host.MetaSession].(string)
	countWith(t, aliceA, handle)
	bobB := connectHTTP(t, urls[1], "", tenantTransport{token: bobToken})
	bobB.ListTools(context.Background(), nil) // the schema the client mirrors the handle from
	res = countWith(t, bobB, handle)
	if got, _ := res.Meta[host.MetaSession].(string); got == handle || !strings.Contains(text(res), "belongs to another client") {
		t.Errorf("bob with alice's handle at b: %v %s; want it refused, a handle of his own offered", res.Meta, text(res))
	}
	aliceB := connectHTTP(t, urls[1], "", tenantTransport{token: aliceToken})
	aliceB.ListTools(context.Background(), nil)
	if res := countWith(t, aliceB, handle); text(res) != "3" {
		t.Errorf("alice's handle at b: %v %s; want her count, 3", res.Meta, text(res))
	}
}

// TestTakenOverSessionJoinsItsTenantsShare: a stateful session taken over
// by another replica counts there as its tenant's, within that tenant's
// share of the sessions (one here): bob's session moving from a to b ends
// his own idle session at b, never alice's.
func TestTakenOverSessionJoinsItsTenantsShare(t *testing.T) {
	store := statestore.NewMemory()
	var urls [2]string
	var rs [2]*replica
	for i, name := range []string{"a", "b"} {
		f := newFixture(t, &host.Options{Replica: name, Store: store, StateKey: replicaKey, Tenants: true, MaxSessionsPerSubject: 1}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		srv := httptest.NewServer(host.Guard(f.h.HTTPHandler(), host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}}))
		t.Cleanup(srv.Close)
		rs[i], urls[i] = &replica{fixture: f, name: name, srv: srv}, srv.URL
	}
	rt := &router{to: rs[0], token: bobToken}
	moving := connectHTTP(t, urls[0], "2025-11-25", rt)
	countWith(t, moving, "")
	bobB := connectHTTP(t, urls[1], "2025-11-25", tenantTransport{token: bobToken})
	countWith(t, bobB, "")
	aliceB := connectHTTP(t, urls[1], "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, aliceB, "")

	rt.point(rs[1])
	if res := countWith(t, moving, ""); text(res) != "2" {
		t.Fatalf("bob's session taken over at b: %v %s; want his count, 2", res.Meta, text(res))
	}
	if res, err := bobB.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}}); err == nil && !res.IsError {
		t.Errorf("bob's idle session at b served after his session moved there (his share is 1): %s", text(res))
	}
	if res := countWith(t, aliceB, ""); text(res) != "2" {
		t.Errorf("alice's session at b after bob's moved there: %v %s; want her count, 2", res.Meta, text(res))
	}
}

// quotaHeld checks that the Redis at raw counts each tenant's stored
// bytes exactly once: each tenant's count of a record is the record's own
// ("m:bytes", for the tenant it names, "m:t"), and no count outlives its
// record; each tenant's sum is its counts', the total theirs. It returns
// the tenants' sums.
func quotaHeld(t *testing.T, raw *redis.Client) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	recs := map[string][2]string{} // record ID -> tenant, bytes
	keys, err := raw.Keys(ctx, "wt:{*}:rec").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		m, err := raw.HMGet(ctx, k, "m:t", "m:bytes").Result()
		if err != nil {
			t.Fatal(err)
		}
		if tenant, _ := m[0].(string); tenant != "" {
			b, _ := m[1].(string)
			recs[strings.TrimSuffix(strings.TrimPrefix(k, "wt:{"), "}:rec")] = [2]string{tenant, b}
		}
	}
	// hash reads a quota hash: its entries, and its own fields (" sum",
	// " total"), which begin with a space.
	hash := func(key string) (entries map[string]int64, own map[string]string) {
		all, err := raw.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		entries, own = map[string]int64{}, map[string]string{}
		for k, v := range all {
			if strings.HasPrefix(k, " ") {
				own[k] = v
				continue
			}
			entries[k], _ = strconv.ParseInt(v, 10, 64)
		}
		return entries, own
	}
	sums := map[string]int64{}
	mirrors, own := hash("wt:q")
	var total int64
	for tenant, mirror := range mirrors {
		total += mirror
		counts, tenantOwn := hash("wt:q:" + tenant)
		var sum int64
		for id, n := range counts {
			sum += n
			if r := recs[id]; r[0] != tenant || r[1] != strconv.FormatInt(n, 10) {
				t.Errorf("tenant %s counts record %s at %d bytes; the record says tenant %q, %q bytes", tenant, id, n, r[0], r[1])
			}
		}
		if got, _ := strconv.ParseInt(tenantOwn[" sum"], 10, 64); got != sum || mirror != sum {
			t.Errorf("tenant %s: sum %d, mirrored %d; its counts make %d", tenant, got, mirror, sum)
		}
		sums[tenant] = sum
	}
	for id, r := range recs {
		if n, _ := strconv.ParseInt(r[1], 10, 64); n > 0 && sums[r[0]] == 0 {
			t.Errorf("record %s of tenant %s (%s bytes) is counted nowhere", id, r[0], r[1])
		}
	}
	if got, _ := strconv.ParseInt(own[" total"], 10, 64); got != total {
		t.Errorf("total %d; the tenants' sums make %d", got, total)
	}
	return sums
}

// TestStoreBytesCountedOnceAcrossReplicas: on two replicas sharing a
// redis-server, a tenant's stored bytes are counted once whichever
// replica writes them: bob's stateful session and his handle, written at
// a, then taken over and written at b (the session back at a, and at b
// again); and given back once when they end there (his session's DELETE).
func TestStoreBytesCountedOnceAcrossReplicas(t *testing.T) {
	rs, raw := redisReplicaSet(t, 0)
	logsOnFailure(t, rs[0], rs[1])
	rt := &router{to: rs[0], token: bobToken}
	bob := connectHTTP(t, rs[0].srv.URL, "2025-11-25", rt)
	countWith(t, bob, "")
	countWith(t, bob, "")
	bobH := connectHTTP(t, rs[0].srv.URL, "", rt)
	bobH.ListTools(context.Background(), nil)
	handle, _ := countWith(t, bobH, "").Meta[host.MetaSession].(string)
	alice := connectHTTP(t, rs[0].srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, alice, "")
	// Alice and bob alone: the store's key check (wt-keycheck) is no
	// tenant's (it was the anonymous pool's).
	before := quotaHeld(t, raw)
	if len(before) != 2 {
		t.Fatalf("tenants counted: %v; want alice and bob", before)
	}

	rt.point(rs[1])
	if res := countWith(t, bob, ""); text(res) != "3" {
		t.Fatalf("bob's session at b: %s", text(res))
	}
	if res := countWith(t, bobH, handle); text(res) != "2" {
		t.Fatalf("bob's handle at b: %s", text(res))
	}
	rs[1].waitLog(t, "session taken over", 2)
	quotaHeld(t, raw)
	// And back to a, which still holds the session's go-sdk half: its
	// claim fenced, it takes the session again from the store.
	rt.point(rs[0])
	if res := countWith(t, bob, ""); text(res) != "4" {
		t.Fatalf("bob's session back at a: %s", text(res))
	}
	quotaHeld(t, raw)
	rt.point(rs[1])
	if res := countWith(t, bob, ""); text(res) != "5" {
		t.Fatalf("bob's session at b again: %s", text(res))
	}
	quotaHeld(t, raw)

	bob.Close() // DELETE, at b
	rec := "wt:{s." + bob.ID() + "}:rec"
	eventually(t, "bob's session record deleted", func() bool { return raw.HGet(context.Background(), rec, "m:t").Val() == "" })
	after := quotaHeld(t, raw)
	if len(after) != 2 {
		t.Errorf("after bob's session ended: %v; want alice's and bob's (his handle)", after)
	}
}

// TestAnonymousShareRefusalTellsNoPoolUsage: a client without a subject
// refused past its tenant's share is not told what that tenant, the
// anonymous pool, holds: the pool is every other client without a
// subject too, and the figure is their use (the refusal past a subject's
// own share may say what the subject holds: it is its own). Two
// anonymous sessions' long calls hold two instances of 64 MiB, past
// which the pool's share of a memory budget of 640 MiB (160 MiB) holds
// no third: a third anonymous client's call is refused, and must not
// read 134217728 (the other clients' instances) in the refusal.
func TestAnonymousShareRefusalTellsNoPoolUsage(t *testing.T) {
	const shared = "shared-token-0123456789"
	f := newFixture(t, &host.Options{Tenants: true, MemoryBudget: 10 * sandbox.DefaultMemoryLimit}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Token: shared, Tokens: map[string]string{"alice": aliceToken}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		other := connectHTTP(t, url, "2025-11-25", tenantTransport{token: shared})
		go other.CallTool(ctx, &mcp.CallToolParams{Name: "slow_compute", Arguments: map[string]any{"seconds": 600}})
	}
	eventually(t, "the other anonymous clients' two calls to run", func() bool { return f.h.LiveInstances() >= 2 })
	cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: shared})
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "carol"}})
	if rpcCode(err) != host.CodeBusy {
		t.Fatalf("a third anonymous call past the pool's share of the memory budget: %v, want CodeBusy", err)
	}
	if held := strconv.Itoa(2 * sandbox.DefaultMemoryLimit); strings.Contains(err.Error(), held) {
		t.Errorf("an anonymous client is told %q: the %s bytes the other anonymous clients' calls hold", err, held)
	}
}

// TestPluginAccessListCursor: a list's next cursor names no entry outside
// the request's rule. The go-sdk pages a list (1,000 entries a page) and
// its cursor is the page's last name, base64 of gob; the access rules
// filter each page after that, so bob, outside a plugin's rule, was handed
// the name of its tool that ended his first page, and, with cursors of
// his own making (any name), the name ending the 1,000 entries after it
// (red team, round four).
func TestPluginAccessListCursor(t *testing.T) {
	var list strings.Builder
	list.WriteString(`{"tools":[`)
	for i := range 1000 {
		if i > 0 {
			list.WriteByte(',')
		}
		fmt.Fprintf(&list, `{"name":"zsecret_%04d","inputSchema":{"type":"object"}}`, i)
	}
	list.WriteString(`]}`)
	cfg := map[string]string{"tools": list.String(), "prompts": `{"prompts":[]}`, "resources": `{"resources":[]}`, "templates": `{"resourceTemplates":[]}`}
	f := newFixtureWith(t, &host.Options{PluginAccess: map[string]host.AccessRule{"hostilelist": {Subjects: []string{"alice"}}}}, func(path string) plugins.Options {
		pol := sandbox.NewPolicy()
		if strings.HasSuffix(path, "hostilelist.wasm") {
			pol = pol.WithConfig(cfg)
		}
		return plugins.Options{Policy: &pol}
	}, map[string]string{
		"counter.wasm":     testplugins.Example(t, "counter"),
		"hostilelist.wasm": testplugins.Test(t, "hostilelist"),
	})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	// Every page, the cursors each names, and the names listed in all.
	pages := func(cs *mcp.ClientSession) (cursors, seen []string) {
		cursor := ""
		for range 10 {
			res, err := cs.ListTools(context.Background(), &mcp.ListToolsParams{Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, tool := range res.Tools {
				seen = append(seen, tool.Name)
			}
			b, _ := base64.URLEncoding.DecodeString(res.NextCursor)
			cursors = append(cursors, string(b))
			if cursor = res.NextCursor; cursor == "" {
				break
			}
		}
		return cursors, seen
	}
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	cursors, seen := pages(bob)
	if slices.ContainsFunc(cursors, func(c string) bool { return strings.Contains(c, "zsecret") }) {
		t.Errorf("bob's pages' cursors %q name alice's plugin's tools", cursors)
	}
	if slices.ContainsFunc(seen, func(n string) bool { return strings.HasPrefix(n, "zsecret") }) || !slices.Contains(seen, "count") {
		t.Errorf("bob lists %v, want counter's tools only", seen)
	}
	// Alice, whose rule it is, still gets every tool once, page by page.
	_, all := pages(connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken}))
	slices.Sort(all)
	if n := len(slices.Compact(slices.Clone(all))); n != len(all) || n != 1000+len(seen) {
		t.Errorf("alice lists %d tools, %d of them distinct; want the 1000 and counter's %d once each", len(all), n, len(seen))
	}
}
