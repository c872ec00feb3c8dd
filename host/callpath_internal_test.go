package host

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// The per-call path's pieces that every tools/call goes through allocate
// no more than they must (issue 27, item 2): allocations are what the
// path's CPU time follows, and unlike time they can be pinned.

// TestProgressSenderIdleAllocates: a call that sends no progress (most
// calls) pays nothing for its sender, which makes its channels and
// goroutine with the first update.
func TestProgressSenderIdleAllocates(t *testing.T) {
	ctx := context.Background()
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{}}
	e := &callEnv{}
	if allocs := testing.AllocsPerRun(100, func() {
		e.progress = progressSender{}
		e.progress.init(ctx, req)
		e.progress.close()
	}); allocs > 0 {
		t.Errorf("a call's progress sender with no update: %v allocations; want none", allocs)
	}
}

// TestSessionBookEnterAllocates: a request entering a booked session and
// leaving it allocates only its cancellable context and its cancel; the session's end
// cancels the requests in it and any that enter after.
func TestSessionBookEnterAllocates(t *testing.T) {
	b := newSessionBook(&Options{})
	ss := &mcp.ServerSession{}
	if _, _, err := b.openSession(ss, "", "", 0); err != nil {
		t.Fatal(err)
	}
	parent, stop := context.WithCancel(context.Background())
	defer stop()
	if allocs := testing.AllocsPerRun(100, func() {
		_, ticket, ok := b.enter(parent, ss)
		if !ok {
			t.Fatal("refused")
		}
		ticket.leave()
	}); allocs > 2 {
		t.Errorf("a request entering and leaving a booked session: %v allocations; want at most 2 (its context and cancel)", allocs)
	}
	ctx, ticket, ok := b.enter(parent, ss)
	if !ok {
		t.Fatal("refused")
	}
	v, _ := b.entries.Load(ss)
	v.(*bookEntry).end() // as deleting does
	if ctx.Err() == nil {
		t.Errorf("a request being served outlived its session's end")
	}
	ticket.leave()
	later, ticket, ok := b.enter(parent, ss)
	if !ok || later.Err() == nil {
		t.Errorf("a request entering after the session's end: ok %v, err %v; want it entered, cancelled", ok, later.Err())
	}
	ticket.leave()
	if e := v.(*bookEntry); len(e.reqs) != 0 || e.busy.Load() != 0 {
		t.Errorf("after leaving: %d requests held, busy %d; want none", len(e.reqs), e.busy.Load())
	}
	if parent.Err() != nil {
		t.Errorf("the session's end cancelled its requests' parent")
	}
}

// TestCallPathSmallPiecesAllocate: the session label a call's context
// carries is one allocation and the same digest as ever; the tenant of
// the clients without a subject, a drain's count of a POST and the
// capabilities check of a tool that requires none allocate nothing.
func TestCallPathSmallPiecesAllocate(t *testing.T) {
	const id = "0123456789ABCDEFGHIJKLMNOPQRSTUV"
	if got, want := SessionLabel(id), "session-"+traceDigest(id); got != want {
		t.Errorf("SessionLabel = %q, want %q", got, want)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = SessionLabel(id) }); allocs > 1 {
		t.Errorf("SessionLabel: %v allocations; want 1", allocs)
	}
	h := &Host{}
	if got, want := h.tenantOf(""), "tenant:"+h.subjectTag(""); got != want {
		t.Errorf("tenantOf(\"\") = %q, want %q", got, want)
	}
	var d drainState
	if allocs := testing.AllocsPerRun(100, func() {
		_ = h.tenantOf("")
		if d.enter() {
			d.leave()
		}
	}); allocs > 0 {
		t.Errorf("the tenant of no subject and a POST's drain count: %v allocations; want none", allocs)
	}
	if d.posts != 0 {
		t.Errorf("posts = %d after as many leaves as enters", d.posts)
	}
	tool := &plugins.Tool{}
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{}}
	if allocs := testing.AllocsPerRun(100, func() {
		if missingCapabilities(tool, req) != nil {
			t.Fatal("capabilities missing for a tool that requires none")
		}
		_ = isRetargetInvalid(nil)
	}); allocs > 0 {
		t.Errorf("a tool requiring no capabilities: %v allocations; want none", allocs)
	}
}

// TestReplayAppendAllocates: the event store keeps a POST stream's event
// as one object (its own link in the tenant's queue), and a stream's
// slice of events grows by doubling.
func TestReplayAppendAllocates(t *testing.T) {
	ctx := context.Background()
	s := newTestReplay(64<<20, false)
	if err := s.Open(ctx, "sess", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Open(ctx, "sess", "post"); err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := s.Append(ctx, "sess", "post", data); err != nil {
			t.Fatal(err)
		}
	}); allocs > 1 {
		t.Errorf("an event appended: %v allocations; want 1", allocs)
	}
	n := 0
	for d, err := range s.After(ctx, "sess", "post", -1) {
		if err != nil || string(d) != string(data) {
			t.Fatalf("replayed %q, %v", d, err)
		}
		n++
	}
	if n != 1001 { // AllocsPerRun's warm-up run too
		t.Errorf("%d events replayed; want 1001", n)
	}
}

// TestHoldStreamsAllocates: a session POST's hold on its call's stream
// (holdStreams, for a GET resuming it) costs its cancellable context and
// cancel, one object that is its context value and its entry, the
// request's copy and the stream's key (11 allocations before); nothing
// to wait on is made unless a GET waits.
func TestHoldStreamsAllocates(t *testing.T) {
	h := &Host{}
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	const id = "0123456789ABCDEFGHIJKLMNOPQRSTUV"
	if allocs := testing.AllocsPerRun(100, func() {
		held, p := h.holdStreams(r, id)
		streamOpened(held.Context(), "1")
		p.release()
	}); allocs > 5 {
		t.Errorf("a POST holding its call's stream: %v allocations; want at most 5", allocs)
	}
	if len(h.drain.gets) != 0 {
		t.Errorf("%d streams still held after their POSTs", len(h.drain.gets))
	}
}

// deadlineRecorder is a ResponseWriter with write deadlines and
// flushes, as net/http's, that keeps nothing.
type deadlineRecorder struct {
	hdr     http.Header
	code, n int
}

func (w *deadlineRecorder) Header() http.Header              { return w.hdr }
func (w *deadlineRecorder) WriteHeader(code int)             { w.code = code }
func (w *deadlineRecorder) Write(p []byte) (int, error)      { w.n += len(p); return len(p), nil }
func (w *deadlineRecorder) FlushError() error                { return nil }
func (w *deadlineRecorder) SetWriteDeadline(time.Time) error { return nil }

// TestKeepAliveCallAllocates: keepAlive's cost to a call's POST, which
// writes its one event and returns long before a comment is due: the
// writer, the handler's copy of the header, the request's copy and the
// handler's own header value, and no timer of its own (a pooled one: 7
// allocations with a timer and its func per POST).
func TestKeepAliveCallAllocates(t *testing.T) {
	event := []byte("event: message\ndata: {}\n\n")
	h := keepAlive(DefaultStreamKeepAlive, DefaultStreamWriteTimeout, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(event)
		http.NewResponseController(w).Flush()
	}))
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Header.Set("Accept", "application/json, text/event-stream")
	w := &deadlineRecorder{hdr: http.Header{}}
	h.ServeHTTP(w, r) // the pool's first timer
	if allocs := testing.AllocsPerRun(100, func() {
		clear(w.hdr)
		w.n = 0
		h.ServeHTTP(w, r)
	}); allocs > 5 {
		t.Errorf("keepAlive around a call's POST: %v allocations; want at most 5", allocs)
	}
	if w.code != http.StatusOK || w.n != len(event) {
		t.Errorf("answered %d with %d bytes; want 200 and the event's %d", w.code, w.n, len(event))
	}
}

// beatRecorder tells each comment keepAlive writes.
type beatRecorder struct {
	deadlineRecorder
	beats chan string
}

func (w *beatRecorder) Write(p []byte) (int, error) {
	if strings.HasPrefix(string(p), ":") {
		select {
		case w.beats <- string(p):
		default: // told already
		}
	}
	return w.deadlineRecorder.Write(p)
}

// TestKeepAlivePooledTimerBeats: a timer that a POST gave back to the
// pool times the comments of the next request's silent stream, which
// it commits early as ever.
func TestKeepAlivePooledTimerBeats(t *testing.T) {
	release := make(chan struct{})
	h := keepAlive(20*time.Millisecond, DefaultStreamWriteTimeout, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/silent" {
			<-release
		}
	}))
	r := httptest.NewRequest(http.MethodPost, "/quick", nil)
	r.Header.Set("Accept", "application/json, text/event-stream")
	quick := &beatRecorder{deadlineRecorder: deadlineRecorder{hdr: http.Header{}}, beats: make(chan string, 1)}
	h.ServeHTTP(quick, r) // gives its timer back, unless it fired first
	silent := &beatRecorder{deadlineRecorder: deadlineRecorder{hdr: http.Header{}}, beats: make(chan string, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest(http.MethodPost, "/silent", nil)
		r.Header.Set("Accept", "application/json, text/event-stream")
		h.ServeHTTP(silent, r)
	}()
	for range 2 {
		if got := <-silent.beats; got != ": keepalive\n\n" {
			t.Errorf("silent stream wrote %q; want a keepalive comment", got)
		}
	}
	close(release)
	<-done
	if silent.code != http.StatusOK || silent.hdr.Get("Content-Type") != "text/event-stream" {
		t.Errorf("the silent stream was committed %d, %q; want 200, an event stream", silent.code, silent.hdr.Get("Content-Type"))
	}
}

// TestWarmCallTakesNoHostLock: a session's tools/call to its warm instance,
// through the MCP stack in memory, completes while another holds the
// host's lock (h.mu, which a reload and Close take): every request read
// the catalogue under it (Catalogue, in the access check) and every call
// the catalogue's change signal (acquire), and with 64 sessions calling
// at once it was the host's most contended wait (issue 27, item 2).
func TestWarmCallTakesNoHostLock(t *testing.T) {
	h, _ := benchHost(t, testplugins.Test(t, "servlet"), "echo")
	ctx := context.Background()
	cs := ConnectInMemory(t, h)
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "warm"}}
	if res, err := cs.CallTool(ctx, params); err != nil || res.IsError {
		t.Fatal(err, res)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(ctx, params)
		if err == nil && res.IsError {
			err = fmt.Errorf("isError: %v", res.Content)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a warm call waits for the host's lock")
	}
}

// TestWarmCallTakesManagerLockTwice: a session's tools/call to its warm
// instance, through the MCP stack in memory, takes the session manager's
// process-wide lock twice, once as its lease is granted and once as it
// ends (seven times before; the first call, which starts the instance,
// eight): with many sessions calling at once it is the host's most
// contended lock (issue 27, item 2). Fails if the call path comes to take
// it again (a manager method asked at each call).
func TestWarmCallTakesManagerLockTwice(t *testing.T) {
	h, _ := benchHost(t, testplugins.Test(t, "servlet"), "echo")
	ctx := context.Background()
	cs := ConnectInMemory(t, h)
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "warm"}}
	for i := range 6 {
		before := h.ses.LockTaken()
		if res, err := cs.CallTool(ctx, params); err != nil || res.IsError {
			t.Fatal(err, res)
		}
		if n := h.ses.LockTaken() - before - 1; i > 0 && n != 2 {
			t.Errorf("warm call %d took the manager's lock %d times; want 2", i, n)
		}
	}
}

// TestReplayPostStreamAllocates: a session POST's stream, opened and
// sent its two events (a progress and the response), costs the event
// store one allocation, the stream, whose first events are its own
// (four more before: each event and the growth of the stream's list).
func TestReplayPostStreamAllocates(t *testing.T) {
	ctx := context.Background()
	s := newTestReplay(64<<20, false)
	if err := s.Open(ctx, "sess", ""); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	data := []byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)
	n := 0
	allocs := testing.AllocsPerRun(1000, func() {
		id := ids[n]
		n++
		if err := s.Open(ctx, "sess", id); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.Append(ctx, "sess", id, data); err != nil {
				t.Fatal(err)
			}
		}
	})
	// The streams' map grows now and then: a fraction of one more.
	if allocs > 1.5 {
		t.Errorf("a POST's stream and its two events: %v allocations; want 1", allocs)
	}
	var got int
	for d, err := range s.After(ctx, "sess", ids[0], -1) {
		if err != nil || string(d) != string(data) {
			t.Fatalf("replayed %q, %v", d, err)
		}
		got++
	}
	if got != 2 {
		t.Errorf("%d events replayed; want 2", got)
	}
}

// TestGuestSpanAllocates: with spans off, a guest's run takes its lease's
// context as it is: it was acquired under the call's, whose span (a
// client's remote one here) it carries already, and a layer putting that
// span back was a WithValue every call (issue 27, item 2).
func TestGuestSpanAllocates(t *testing.T) {
	h, tool := benchHost(t, testplugins.Example(t, "counter"), "count")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
	var conn int
	l, err := h.ses.Acquire(ctx, sessions.Conn(&conn, "c", "c"), tool.Plugin())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done(nil)
	var gctx context.Context
	if allocs := testing.AllocsPerRun(100, func() {
		var span trace.Span
		gctx, span = h.guestSpan(ctx, tool, nil, l)
		telemetry.End(span, nil)
	}); allocs > 0 {
		t.Errorf("a guest's context and span with spans off: %v allocations; want none", allocs)
	}
	if got := trace.SpanContextFromContext(gctx); !got.Equal(sc) {
		t.Errorf("the guest's span context is %v; want the call's, %v", got, sc)
	}
}
