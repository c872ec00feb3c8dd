package host_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// streamCutter serves next, and lets a test end sessions' standing GET
// streams from the server's side (as a failover, a drain or a restart
// does) and hold their reconnections.
type streamCutter struct {
	next http.Handler
	gets chan string // each standing GET's Last-Event-ID ("" none), as it arrives

	mu     sync.Mutex
	cancel context.CancelFunc // the standing GET being served
	hold   chan struct{}      // non-nil: the next GET waits for it to close
}

func newStreamCutter(next http.Handler) *streamCutter {
	return &streamCutter{next: next, gets: make(chan string, 16)}
}

func (c *streamCutter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.Header.Get("Mcp-Session-Id") == "" {
		c.next.ServeHTTP(w, r)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c.mu.Lock()
	c.cancel = cancel
	hold := c.hold
	c.hold = nil
	c.mu.Unlock()
	c.gets <- r.Header.Get("Last-Event-ID")
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done(): // the client left (the test's end)
		}
	}
	c.next.ServeHTTP(w, r.WithContext(ctx))
	if ctx.Err() != nil && r.Context().Err() == nil {
		// Ended by cut: the client comes back at once, not after its
		// own second or two a time.
		fmt.Fprint(w, "retry: 10\n\n")
	}
}

// cut ends the standing stream being served.
func (c *streamCutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel()
}

// holdNext makes the next standing GET wait until release is called.
func (c *streamCutter) holdNext() (release func()) {
	ch := make(chan struct{})
	c.mu.Lock()
	c.hold = ch
	c.mu.Unlock()
	return func() { close(ch) }
}

// nextGet waits for the next standing GET and returns its Last-Event-ID;
// it fails the test if the session ended at the client first.
func (c *streamCutter) nextGet(t *testing.T, ended <-chan error) string {
	t.Helper()
	select {
	case eid := <-c.gets:
		return eid
	case err := <-ended:
		t.Fatalf("the client's session ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not reopen its standing stream")
	}
	return ""
}

// cutSession serves h through a streamCutter and connects a 2025-11-25
// go-sdk client with copts to it; ended gets the end of its session.
func cutSession(t *testing.T, h http.Handler, copts *mcp.ClientOptions) (cut *streamCutter, cs *mcp.ClientSession, ended <-chan error) {
	t.Helper()
	cut = newStreamCutter(h)
	srv := httptest.NewServer(cut)
	t.Cleanup(srv.Close)
	cs = connectHTTPEra(t, srv.URL, "2025-11-25", copts, nil)
	end := make(chan error, 1)
	go func() { end <- cs.Wait() }()
	return cut, cs, end
}

// TestStandingStreamDroppedOftenKeepsSession: a 2025-11-25 session whose
// standing GET stream the server ends 8 times, nothing sent between. The
// go-sdk client (v1.8.0) counts every end of that stream that brought no
// event with an ID, over the session's life, and past its MaxRetries (5)
// ends the session though every reconnection succeeded: the host's
// standing streams carried none unless a notification was sent. Each
// must carry an event with an ID of its own (a priming event), and the
// session go on.
func TestStandingStreamDroppedOftenKeepsSession(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cut, cs, ended := cutSession(t, f.h.HTTPHandler(), nil)
	if got := text(call(t, cs, "count", nil)); got != "1" {
		t.Fatalf("count: %s", got)
	}

	seen := map[string]bool{}
	for i := range 8 {
		eid := cut.nextGet(t, ended)
		if i > 0 && (eid == "" || seen[eid]) {
			t.Errorf("standing GET %d resumes from %q: want an event ID of the last stream's own", i+1, eid)
		}
		seen[eid] = true
		cut.cut()
	}
	cut.nextGet(t, ended)
	stillCounting(t, cs, ended, "2", "after the stream was dropped 8 times")
}

// stillCounting checks that the session's next count is want, and that
// the client's session did not end.
func stillCounting(t *testing.T, cs *mcp.ClientSession, ended <-chan error, want, when string) {
	t.Helper()
	if got := text(call(t, cs, "count", nil)); got != want {
		t.Fatalf("count %s: %s, want %s", when, got, want)
	}
	select {
	case err := <-ended:
		t.Fatalf("the client's session ended: %v", err)
	default:
	}
}

// TestStandingStreamResumesThroughPrime: notifications sent while a
// session's standing stream is down are delivered once when it comes
// back, whether the client resumes from a notification's event ID or
// from a priming event's.
func TestStandingStreamResumesThroughPrime(t *testing.T) {
	f := newReloadFixture(t, map[string][]byte{"counter.wasm": testplugins.Bytes(t, testplugins.Example(t, "counter"))})
	changed := make(chan struct{}, 16)
	cut, cs, ended := cutSession(t, f.h.HTTPHandler(), &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	waitChange := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no tools/list_changed", what)
		}
	}

	cut.nextGet(t, ended)
	// A first notification, live on the stream; then the stream ends
	// and the client resumes from that notification's ID.
	f.deploy(t, "hash.wasm", testplugins.Bytes(t, testplugins.Example(t, "hash")))
	waitChange("live")
	cut.cut()
	if eid := cut.nextGet(t, ended); eid == "" {
		t.Fatal("the stream resumed from no event after a notification")
	}
	// Ended again with nothing sent: the client resumes from the
	// priming event's ID, and what was sent while it was away comes
	// once, after it.
	release := cut.holdNext()
	cut.cut()
	eid := cut.nextGet(t, ended)
	if eid == "" {
		t.Fatal("the stream resumed from no event")
	}
	f.deploy(t, "notes.wasm", testplugins.Bytes(t, testplugins.Example(t, "notes")))
	release()
	waitChange("sent while the stream was down")
	cut.cut()
	cut.nextGet(t, ended)
	cut.cut()
	cut.nextGet(t, ended)
	// A call's round trip, for anything sent twice to have arrived.
	if got := text(call(t, cs, "count", nil)); got != "1" {
		t.Fatalf("count: %s", got)
	}
	select {
	case <-changed:
		t.Fatal("a notification was delivered twice")
	default:
	}
}

// TestHostileLastEventID: a standing GET with a Last-Event-ID in the
// host's format that it did not give, or gave another session, gets no
// other session's events: it is refused (400) or gets the session's own
// (here none), and the host goes on serving. The session that has events
// resumes through the host's IDs: from one that stands for nothing it
// reached, all it has; from one that stands for its last event, nothing.
func TestHostileLastEventID(t *testing.T) {
	// A keep-alive a second into each stream marks the end of what was
	// replayed on it.
	f := newReloadFixtureWith(t, &host.Options{StreamKeepAlive: time.Second}, map[string][]byte{"counter.wasm": testplugins.Bytes(t, testplugins.Example(t, "counter"))})
	srv := httptest.NewServer(endsStreams(f.h.HTTPHandler()))
	t.Cleanup(srv.Close)
	url := srv.URL

	// other has one notification on its standing stream, the sessions
	// the cases use (made after it) none.
	other := rawSession(t, url)
	f.deploy(t, "a.wasm", testplugins.Bytes(t, testplugins.Example(t, "hash")))
	none := standingUntilEvent(t, url, other)
	if _, events := standingEvents(t, url, other, none); len(events) != 1 {
		t.Fatalf("other resumed from its first priming event: %d events, want its one", len(events))
	}
	last := standingPrimeID(t, url, other, "_0")
	if _, events := standingEvents(t, url, other, last); len(events) != 0 {
		t.Fatalf("other resumed from the priming event after its last: %d events, want none", len(events))
	}
	cases := []string{
		last, none, // other's
		"~", "~_", "~_0", "~_1", "~x_1", "~0123456789abcdef", "~0123456789abcdef_",
		"~0123456789abcdef_-1", "~0123456789abcdef_+1", "~0123456789abcdef_1_2",
		"~0123456789abcdef_99999999999999999999999999", "~0123456789abcdef_2147483648",
		"~0123456789abcdef_2147483647", "~0123456789abcdef_0x1", "~0123456789ABCDEF_1",
		"~0123456789abcdef_01", "~0123456789abcdef_1 ", "~0123456789abcdef_1\t",
		"~" + strings.Repeat("f", 4096) + "_1", "~0123456789abcdef_" + strings.Repeat("9", 4096),
		"_-1", "_99", "abc_1", "~~0123456789abcdef_1",
	}
	sessions := make([]string, len(cases))
	for i := range cases {
		sessions[i] = rawSession(t, url)
	}
	var wg sync.WaitGroup
	for i, eid := range cases {
		wg.Go(func() {
			status, events := standingEvents(t, url, sessions[i], eid)
			if status != http.StatusOK && status != http.StatusBadRequest {
				t.Errorf("Last-Event-ID %.40q: status %d", eid, status)
			}
			if len(events) != 0 {
				t.Errorf("Last-Event-ID %.40q: %d events of a session that has none", eid, len(events))
			}
		})
	}
	wg.Wait()
	// The host goes on: other's stream still resumes.
	if _, events := standingEvents(t, url, other, none); len(events) != 1 {
		t.Errorf("other resumed from its first priming event at the end: %d events, want its one", len(events))
	}
}

// standingUntilEvent opens session's standing stream afresh and reads it
// until its first message event (delivered live or replayed); it returns
// the priming event's ID.
func standingUntilEvent(t *testing.T, url, session string) string {
	t.Helper()
	resp, end, err := openStanding(url, session, "")
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	var prime, id string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: ~"):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: {"):
			if prime == "" {
				t.Fatal("a message event before the priming event")
			}
			return prime
		case line == "" && id != "":
			prime, id = id, ""
		}
	}
	t.Fatalf("the stream ended with no message event: %v", sc.Err())
	return ""
}

// rawSession initializes a 2025-11-25 session over plain HTTP and
// returns its ID.
func rawSession(t *testing.T, url string) string {
	t.Helper()
	post := func(session, body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: %s, session %q", resp.Status, id)
	}
	post(id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return id
}

// standingEvents opens session's standing stream with Last-Event-ID eid
// ("" none) and returns the status and the message events replayed.
func standingEvents(t *testing.T, url, session, eid string) (int, []string) {
	t.Helper()
	status, events, _ := standing(t, url, session, eid)
	return status, events
}

// standingPrimeID returns the ID of the priming event of session's
// standing stream opened with Last-Event-ID eid.
func standingPrimeID(t *testing.T, url, session, eid string) string {
	t.Helper()
	_, _, prime := standing(t, url, session, eid)
	if prime == "" {
		t.Fatal("no priming event on the standing stream")
	}
	return prime
}

// streamEnds holds, for each stream openStanding opened (by its
// X-Test-Stream header), a channel endsStreams closes once the server
// has ended it.
var streamEnds sync.Map

// endsStreams serves next, and says when each stream openStanding
// opened has ended at the server: a GET of the session's stream right
// after another would otherwise race the server's noticing the first
// one's end (409 while it holds it).
func endsStreams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if ch, ok := streamEnds.Load(r.Header.Get("X-Test-Stream")); ok {
			close(ch.(chan struct{}))
		}
	})
}

// openStanding opens session's standing stream at url (endsStreams'
// server) with Last-Event-ID eid ("" none), as a 2025-11-25 client
// does; end closes it and waits for the server to have ended it.
func openStanding(url, session, eid string) (_ *http.Response, end func(), _ error) {
	token := rand.Text()
	ended := make(chan struct{})
	streamEnds.Store(token, ended)
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("X-Test-Stream", token)
	if eid != "" {
		req.Header.Set("Last-Event-ID", eid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		streamEnds.Delete(token)
		return nil, nil, err
	}
	return resp, func() {
		resp.Body.Close()
		<-ended
		streamEnds.Delete(token)
	}, nil
}

// standing opens session's standing stream with Last-Event-ID eid and
// reads it until its first keep-alive or its end; it returns the status,
// the message events' data and the priming event's ID. The stream is
// ended by closing its body once the events replayed are read: the
// go-sdk writes them at once, after the priming event and before the
// stream's first keep-alive comment.
func standing(t *testing.T, url, session, eid string) (status int, events []string, prime string) {
	t.Helper()
	status, events, _, prime = standingRead(t, url, session, eid)
	return status, events, prime
}

// standingRead is standing, with the ID of the last message event.
func standingRead(t *testing.T, url, session, eid string) (status int, events []string, last, prime string) {
	t.Helper()
	resp, end, err := openStanding(url, session, eid)
	if err != nil {
		t.Error(err) // from the test's goroutines too
		return 0, nil, "", ""
	}
	defer end()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, "", ""
	}
	sc := bufio.NewScanner(resp.Body)
	var name, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ": keepalive"):
			return resp.StatusCode, events, last, prime
		case strings.HasPrefix(line, "event:"):
			name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "data:"):
			if d := strings.TrimSpace(strings.TrimPrefix(line, "data:")); d != "" {
				events, last = append(events, d), id
			} else if name == "prime" {
				prime = id
			}
		case line == "":
			name, id = "", ""
		}
	}
	return resp.StatusCode, events, last, prime
}

// TestDrainingReplicaKeepsDirectClientsSession: a client connected to a
// replica without a proxy, while the replica drains (its Delay, in which
// it still serves its sessions' calls). The drain ends the client's
// standing stream, and the client reopens it at once, at the same
// replica: a 503 there (as the draining replica answered) is the
// session's end at the go-sdk client (v1.8.0). It gets an event stream
// that asks it back in a few seconds, keeping its resume point, and
// comes back; its calls go on meanwhile.
func TestDrainingReplicaKeepsDirectClientsSession(t *testing.T) {
	opts := host.Options{Replica: "a", Store: statestore.NewMemory(), StateKey: replicaKey}
	f := newFixture(t, &opts, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	logsOnFailure(t, &replica{fixture: f, name: "a"})
	cut, cs, ended := cutSession(t, f.h.HTTPHandler(), nil)
	if got := text(call(t, cs, "count", nil)); got != "1" {
		t.Fatalf("count: %s", got)
	}
	cut.nextGet(t, ended)

	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- f.h.Drain(ctx, host.DrainOptions{Delay: time.Minute}) }()
	t.Cleanup(func() { cancel(); <-drained })
	// Reopened after the drain ended it (answered, not refused), and
	// again after that answer.
	if eid := cut.nextGet(t, ended); eid == "" {
		t.Error("the stream the drain ended resumed from no event")
	}
	cut.nextGet(t, ended)
	stillCounting(t, cs, ended, "2", "while the replica drains")
}
