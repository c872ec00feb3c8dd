package host_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Regression tests of the session layer and the catalogue's one writer
// (issue 11). Each failed on the host before them.

// A guest's relist that claims another plugin's tool names is refused, and
// the plugin that serves them keeps them, whatever the plugins' names sort
// as; a later reload keeps things as they are.
func TestRelistCannotTakeOverNames(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{
		"aaa.wasm":  testplugins.Bytes(t, testplugins.Test(t, "relister")), // sorts first
		"hash.wasm": testplugins.Bytes(t, testplugins.Example(t, "hash")),
	})
	changed := make(chan struct{}, 10)
	cs := f.connect(t, "", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	if got := text(call(t, cs, "relister_add", map[string]any{"name": "hash"})); got != "added hash" {
		t.Fatal(got)
	}
	f.waitLog(t, `tool name collision: \"hash\" is served by plugin \"hash\"`, 1)
	want := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" // sha256("abc")
	if got := text(call(t, cs, "hash", map[string]any{"text": "abc", "algorithm": "sha256"})); !strings.Contains(got, want) {
		t.Errorf("hash after the refused relist = %q, want the hash plugin's digest", got)
	}
	if _, errs := f.r.Rescan(context.Background()); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := text(call(t, cs, "hash", map[string]any{"text": "abc", "algorithm": "sha256"})); !strings.Contains(got, want) {
		t.Errorf("hash after a rescan = %q", got)
	}
	// A name no one serves is taken, and clients are told once. (From
	// another session: this one's guest still lists "hash".)
	other := f.connect(t, "", nil)
	call(t, other, "relister_add", map[string]any{"name": "fresh"})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no list_changed for an accepted relist")
	}
	if got := text(call(t, other, "fresh", nil)); got != "relister's fresh" {
		t.Errorf("fresh = %q", got)
	}
	if n := len(changed); n != 0 {
		t.Errorf("%d list_changed notifications more than the one change", n)
	}
}

// A relist that changes nothing notifies no one.
func TestRelistUnchangedNotifiesNoOne(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{"relister.wasm": testplugins.Bytes(t, testplugins.Test(t, "relister"))})
	var mu sync.Mutex
	notified := 0
	changed := make(chan struct{}, 10)
	cs := f.connect(t, "", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		mu.Lock()
		notified++
		mu.Unlock()
		changed <- struct{}{}
	}})
	for range 3 {
		call(t, cs, "relister_same", nil)
	}
	// Notifications arrive in order: once the real change's has come, any
	// from the no-op relists would have come before it.
	call(t, cs, "relister_add", map[string]any{"name": "x"})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no list_changed for a real change")
	}
	mu.Lock()
	defer mu.Unlock()
	if notified != 1 {
		t.Errorf("list_changed sent %d times, want 1 (for the one real change)", notified)
	}
}

// A swap while a stateless plugin's pooled call is in flight lets the call
// finish on its version; its instance is not closed under it.
func TestStatelessSwapUnderPooledCall(t *testing.T) {
	// hostileask's ask_plain asks a question, then fails with the answer
	// as its message: a guest error, which keeps the instance.
	v1 := withCustomSection(testplugins.Bytes(t, testplugins.Test(t, "hostileask")), plugins.StatelessSection)
	v2 := withCustomSection(v1, "version2")
	f := newReloadFixture(t, map[string][]byte{"hostileask.wasm": v1})
	asked := make(chan struct{}, 1)
	release := make(chan struct{})
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked <- struct{}{}
		<-release
		return accept("ann"), nil
	}})
	done := make(chan *mcp.CallToolResult)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask_plain", Arguments: map[string]any{}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select { // the pooled guest is mid-call, waiting for the answer
	case <-asked:
	case res := <-done:
		t.Fatalf("the call did not ask: %q", text(res))
	}
	f.deploy(t, "hostileask.wasm", v2)
	close(release)
	res := <-done
	if res == nil || !strings.Contains(text(res), "ann") || strings.Contains(text(res), "closed") || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("the pooled call across a swap: %q, _meta %v; want the guest's answer", text(res), res.Meta)
	}
	if res := call(t, cs, "ask_plain", map[string]any{}); !strings.Contains(text(res), "ann") {
		t.Errorf("a call on the new version: %q", text(res))
	}
	eventually(t, "the old instance freed", func() bool { return f.h.LiveInstances() <= 1 })
}

// Calls parked for an answer never pin the server: at the instance limit,
// the call that has waited longest is evicted to make room, and its
// client is told when it comes back.
func TestParkedCallsAreEvictedAtCapacity(t *testing.T) {
	f := pdkhostFixture(t, &host.Options{MaxInstances: 2})
	var parked []*mcp.CallToolResult
	var clients []*mcp.ClientSession
	for range 2 {
		cs, res := rawRound(t, f, nil)
		clients, parked = append(clients, cs), append(parked, res)
	}
	// Both instances are held by parked calls; a third client gets in.
	cs := f.connect(t, "", nil)
	if got := text(call(t, cs, "log", map[string]any{"level": "info", "message": "x"})); got != "logged" {
		t.Fatalf("a call at capacity with only parked calls: %q", got)
	}
	f.waitLog(t, "waiting call evicted", 1)
	if _, err := retry(clients[0], parked[0].RequestState, accept("late")); err == nil || !strings.Contains(err.Error(), "invalid request state") {
		t.Errorf("a retry of the evicted call: %v", err)
	}
	// The other parked call goes on.
	res, err := retry(clients[1], parked[1].RequestState, accept("ann"))
	if err != nil || res.RequestState == "" {
		t.Fatalf("the parked call that was not evicted: %v %+v", err, res)
	}
}

// A client parks at most MaxParkedPerClient calls: a further question is
// answered "cancel" at once, with the reason, and the call goes on.
func TestParkedCallsPerClient(t *testing.T) {
	f := confirmFixture(t, &host.Options{MaxParkedPerClient: 1})
	cs := f.connect(t, "", &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	first, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 1}})
	if err != nil || first.RequestState == "" {
		t.Fatalf("first call: %v %+v", err, first)
	}
	// The same client's second question, from another plugin (confirm):
	// refused at once, not parked.
	call(t, cs, "add", map[string]any{"item": "x"})
	second, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "delete", Arguments: map[string]any{"item": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if second.RequestState != "" || !strings.HasPrefix(text(second), "not deleted") {
		t.Errorf("a second question past the client's parking limit: %+v %q", second, text(second))
	}
	// The first goes on.
	if res, err := retry(cs, first.RequestState, accept("ann")); err != nil || text(res) != "accept:ann" {
		t.Errorf("the parked call: %v %q", err, text(res))
	}
}

// TestParkedBytesGivenBackOnAbandon: the parked calls' bytes are bounded
// in all (MaxParkedBytes, 3.5 units here): 3 calls of a unit of
// arguments park, a 4th is refused as too many calls waiting. Abandoned
// (their client never answers), they give their bytes back, once: 3 park
// again, and a 4th is still refused.
//
// Each round of 4 calls must end within AbandonAfter of its first park,
// or the first is abandoned before the 4th and the 4th parks. A unit is
// 64 KiB, not 1 MiB: a call of 1 MiB took 3 s under -race on a loaded
// machine, 12 s a round against the 8 s it had, where one of 64 KiB
// takes 0.1 s.
func TestParkedBytesGivenBackOnAbandon(t *testing.T) {
	const unit = 64 << 10
	f := pdkhostFixture(t, &host.Options{MaxParkedBytes: 7 * unit / 2, AbandonAfter: 15 * time.Second})
	// Over sessionless HTTP each call is a client of its own, with an
	// instance of its own to park on.
	url := serveGuarded(t, f, host.GuardOptions{})
	cs := connectHTTPEra(t, url, "", &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}, nil)
	pad := strings.Repeat("x", unit)
	parkUntilRefused := func() int {
		t.Helper()
		for n := 0; n < 8; n++ {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 1, "pad": pad}})
			if err != nil {
				t.Fatalf("a call of %d bytes of arguments: %v", unit, err)
			}
			if res.RequestState == "" {
				if !strings.Contains(text(res), "too many calls wait for a client's answer") {
					t.Errorf("a call not parked: %q, want refused as too many calls waiting", text(res))
				}
				return n
			}
		}
		return 8
	}
	if n := parkUntilRefused(); n != 3 {
		t.Fatalf("%d calls of a unit parked before one was refused, want 3 within 3.5 units", n)
	}
	if v := parkedBytes(t, f); v < 3*unit || v > 7*unit/2 {
		t.Errorf("wasmtools_parked_bytes = %d with 3 calls of a unit parked, want their bytes", v)
	}
	f.waitLog(t, "parked call abandoned", 3)
	if v := parkedBytes(t, f); v != 0 {
		t.Errorf("wasmtools_parked_bytes = %d after the parked calls were abandoned, want 0", v)
	}
	if n := parkUntilRefused(); n != 3 {
		t.Errorf("after the abandonments %d calls of a unit parked before one was refused, want 3: their bytes given back once", n)
	}
}

// parkedBytes reads the wasmtools_parked_bytes gauge.
func parkedBytes(t *testing.T, f *fixture) int {
	t.Helper()
	rec := httptest.NewRecorder()
	f.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m := regexp.MustCompile(`(?m)^wasmtools_parked_bytes (\S+)`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		t.Fatal("no wasmtools_parked_bytes in the metrics")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(v)
}

// A call waiting for a person does not hold a concurrency token: with
// max_concurrent_calls = 1, other calls run while it waits.
func TestWaitingCallGivesBackItsTurn(t *testing.T) {
	f := pdkhostFixture(t, &host.Options{MaxConcurrentCalls: 1})
	asked := make(chan struct{})
	release := make(chan struct{})
	waiting := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		close(asked)
		<-release
		return accept("ann"), nil
	}})
	done := make(chan string)
	go func() {
		res, err := waiting.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 1}})
		if err != nil {
			t.Error(err)
			done <- ""
			return
		}
		done <- text(res)
	}()
	<-asked
	other := f.connect(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := other.CallTool(ctx, &mcp.CallToolParams{Name: "log", Arguments: map[string]any{"level": "info", "message": "x"}})
	if err != nil || text(res) != "logged" {
		t.Fatalf("a call while another waits for a person: %v %v", err, res)
	}
	close(release)
	if got := <-done; got != "accept:ann" {
		t.Errorf("the waiting call: %q", got)
	}
}

// The time a call waits for a person does not count against its timeout:
// a person who answers after three timeouts still gets the call's result,
// for a question (create_elicitation) and a sampling request
// (create_message, which a client before 2026-07-28 is sent while the call
// waits). Since stop 56 only the wait is paused (callEnv.waitForPerson);
// the rest of a host function counts (TestHostileTimeouts' sample_spin).
func TestPersonsWaitDoesNotCount(t *testing.T) {
	const timeout = 2 * time.Second // the guest's own part takes milliseconds
	f := newFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(timeout), map[string]string{
		"hostileask.wasm": testplugins.Test(t, "hostileask"),
		"hyperhost.wasm":  testplugins.Test(t, "hyperhost"),
	})
	slowly := func(ctx context.Context) error {
		select {
		case <-time.After(3 * timeout): // the subject: a person slower than the timeout, not a wait for readiness
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if err := slowly(ctx); err != nil {
				return nil, err
			}
			return accept("ann"), nil
		},
		CreateMessageHandler: func(ctx context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			if err := slowly(ctx); err != nil {
				return nil, err
			}
			return &mcp.CreateMessageResult{Role: "assistant", Model: "slow-model", Content: &mcp.TextContent{Text: "hi back"}}, nil
		},
	})
	// ask_plain fails with the answer as its message.
	if res := call(t, cs, "ask_plain", map[string]any{}); !strings.Contains(text(res), "ann") {
		t.Errorf("a question answered after %v, with a %v timeout: %q; want the answer", 3*timeout, timeout, text(res))
	}
	if res := call(t, cs, "sample", nil); !strings.Contains(text(res), "slow-model") {
		t.Errorf("a sampling request answered after %v, with a %v timeout: %q; want the answer", 3*timeout, timeout, text(res))
	}
}

// TestTurnAfterPersonCounts: once the person answered, the call's wait
// for a concurrency token counts against its timeout. A call whose person
// answered while another call held the server's one slot, for longer than
// the first call's timeout, waited for the slot however long that took
// until stop 57, its deadline still paused.
func TestTurnAfterPersonCounts(t *testing.T) {
	const timeout = 2 * time.Second
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "late")
	}))
	defer srv.Close()
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	defer unblock() // before srv.Close, which waits for the handler
	target := strings.TrimPrefix(srv.URL, "http://")
	f := newFixtureWith(t, &host.Options{MaxConcurrentCalls: 1}, func(path string) plugins.Options {
		pol := sandbox.NewPolicy().WithCallTimeout(timeout)
		if strings.HasSuffix(path, "grants.wasm") {
			// The call that holds the slot waits in its fetch (a host
			// function that does not pause) until the test releases it.
			pol = sandbox.NewPolicy().WithCallTimeout(time.Minute).WithNetwork(sandbox.Network{AllowedHosts: []string{target}, AllowPrivate: true, Timeout: time.Minute})
		}
		return plugins.Options{Policy: &pol}
	}, map[string]string{
		"hostileask.wasm": testplugins.Test(t, "hostileask"),
		"grants.wasm":     testplugins.Test(t, "grants"),
	})
	asked, answer := make(chan struct{}), make(chan struct{})
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			close(asked)
			select {
			case <-answer:
				return accept("ann"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	})
	other := f.connect(t, "2025-11-25", nil)
	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	callAsync := func(cs *mcp.ClientSession, tool string, args any) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
			ch <- outcome{res, err}
		}()
		return ch
	}
	asking := callAsync(cs, "ask_plain", map[string]any{})
	<-asked // the asking call gave its slot back
	holding := callAsync(other, "fetch", map[string]any{"url": srv.URL})
	<-arrived // the fetching call holds the slot
	close(answer)
	select {
	case o := <-asking:
		if o.err != nil || !strings.Contains(text(o.res), "timed out") {
			t.Errorf("the answered call, with the slot held past its %v timeout: %v, %q; want it timed out", timeout, o.err, text(o.res))
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the answered call still waited for the slot 30 s after its person answered; its timeout is %v", timeout)
	}
	unblock()
	if o := <-holding; o.err != nil || text(o.res) != "200 late" {
		t.Errorf("the call that held the slot: %v, %v; want 200 late", o.err, o.res)
	}
}

// Close honours its context: a guest that never returns does not hold it
// for the call timeout. And it ends the watchers of the sessions still
// open.
func TestCloseHonoursContext(t *testing.T) {
	before := runtime.NumGoroutine()
	f := newFixture(t, nil, sandbox.NewPolicy().WithCallTimeout(10*time.Second), map[string]string{"pdkhost.wasm": testplugins.Test(t, "pdkhost")})
	cs := f.connect(t, "", nil)
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
	}()
	eventually(t, "the spinning call's instance", func() bool { return f.h.LiveInstances() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := f.h.Close(ctx); err == nil {
		t.Error("Close with a call still running returned no error")
	}
	select {
	case <-callDone:
		t.Error("Close waited for the running call (its 10s deadline) instead of its 200ms context")
	default:
	}
	<-callDone
	cs.Close()
	eventually(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before+5 })
}
