package host_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// stuckDelay is how late a healthy client may be told of a change while
// other clients' streams do not read: far under the write timeout (10 s)
// that a stuck stream held every later one up by, each.
const stuckDelay = 3 * time.Second

// stuckBobs are the tenants whose streams stop being read.
var stuckBobs = []string{"bob0", "bob1", "bob2", "bob3"}

// stuckServer serves f's host behind Guard, alice's and the bobs' tokens,
// over a watchedListener.
func stuckServer(t *testing.T, f *reloadFixture) (*httptest.Server, *watchedListener, map[string]string) {
	t.Helper()
	tokens := map[string]string{"alice": aliceToken}
	for _, b := range stuckBobs {
		tokens[b] = b + "-token-0123456789"
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", f.h.HTTPHandler())
	srv := httptest.NewUnstartedServer(host.Guard(mux, host.GuardOptions{Tokens: tokens}))
	wl := &watchedListener{Listener: srv.Listener, conns: map[string]*watchedConn{}}
	srv.Listener = wl
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, wl, tokens
}

// openStuck sends head (a request, its body included) over a connection
// with a receive buffer as small as the kernel allows, reads the response
// up to a line holding until, and never reads again. It returns the
// server's side of the connection, and that line.
func openStuck(t *testing.T, srv *httptest.Server, wl *watchedListener, head, until string) (*watchedConn, string) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1) }); err != nil {
			return err
		}
		return serr
	}}
	raw, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() }) // before srv.Close, which waits for its handler
	fmt.Fprint(raw, head)
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a stuck stream's request: %v %v", resp, err)
	}
	sc := bufio.NewScanner(resp.Body)
	for !strings.Contains(sc.Text(), until) {
		if !sc.Scan() {
			t.Fatalf("a stuck stream ended before %q: %v", until, sc.Err())
		}
	}
	wc := wl.conn(raw.LocalAddr())
	if wc == nil {
		t.Fatal("a stuck stream's connection was not accepted through the listener")
	}
	return wc, sc.Text()
}

// fillStuck calls update_burst as cs until wc's writes stop going
// through (false if they still do after a minute): cs's tenant's
// stream over wc is the only one told.
func fillStuck(cs *mcp.ClientSession, wc *watchedConn) bool {
	fill, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for fill.Err() == nil {
			if _, err := cs.CallTool(fill, &mcp.CallToolParams{Name: "update_burst", Arguments: map[string]any{}}); err != nil {
				return
			}
		}
	}()
	select {
	case <-wc.stuck:
		return true
	case <-time.After(60 * time.Second):
		return false
	}
}

// fillAll fills each of stuck with bobs' updates, all at once.
func fillAll(t *testing.T, bobs []*mcp.ClientSession, stuck []*watchedConn) {
	t.Helper()
	filled := make(chan bool)
	for i := range bobs {
		go func() { filled <- fillStuck(bobs[i], stuck[i]) }()
	}
	for range bobs {
		if !<-filled {
			t.Fatal("a stuck stream never filled")
		}
	}
}

// toldInTime deploys name and waits for ch, failing past stuckDelay.
func toldInTime(t *testing.T, f *reloadFixture, ch <-chan struct{}, name, plugin, what string) {
	t.Helper()
	f.deploy(t, name, testplugins.Bytes(t, testplugins.Example(t, plugin)))
	start := time.Now()
	notified(t, ch, what)
	if d := time.Since(start); d > stuckDelay {
		t.Errorf("%s %v after the change, past %v", what, d.Round(time.Millisecond), stuckDelay)
	} else {
		t.Logf("%s %v after the change", what, d.Round(time.Millisecond))
	}
}

// TestStuckStandingStreamsDelayNoOne: four tenants' 2025-11-25 sessions
// open their standing GET streams and never read them; their own resource
// updates fill them. Alice's session, opened after theirs, must be told of
// each plugin deployed within a few seconds. The go-sdk (v1.8.0) sends a
// list change to its sessions one after another from one goroutine, each
// written straight to its stream: each stuck stream held alice up until
// its write's deadline (10 s).
func TestStuckStandingStreamsDelayNoOne(t *testing.T) {
	f := newReloadFixtureWith(t, &host.Options{Tenants: true}, map[string][]byte{"hostileupdate.wasm": testplugins.Bytes(t, testplugins.Test(t, "hostileupdate"))})
	srv, wl, tokens := stuckServer(t, f)
	ctx := context.Background()

	var stuck []*watchedConn
	var bobs []*mcp.ClientSession
	for _, b := range stuckBobs {
		bob := connectHTTPEra(t, srv.URL, "2025-11-25", nil, stuckTransport{tokens[b]})
		if err := bob.Subscribe(ctx, &mcp.SubscribeParams{URI: "flood://item/1"}); err != nil {
			t.Fatal(err)
		}
		head := fmt.Sprintf("GET /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n", srv.Listener.Addr(), tokens[b], bob.ID())
		wc, _ := openStuck(t, srv, wl, head, "id: ")
		stuck = append(stuck, wc)
		bobs = append(bobs, bob)
	}
	changed := make(chan struct{}, 16)
	connectHTTPEra(t, srv.URL, "2025-11-25", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}, bearer{aliceToken})
	fillAll(t, bobs, stuck)

	toldInTime(t, f, changed, "counter.wasm", "counter", "tools/list_changed to alice, past four streams that do not read")
	toldInTime(t, f, changed, "hash.wasm", "hash", "the next tools/list_changed to alice")
}

// TestStuckListensDelayNoOne is TestStuckStandingStreamsDelayNoOne for
// 2026-07-28 clients: four tenants' subscriptions/listen streams are not
// read, and alice's listen must be told of each plugin deployed within a
// few seconds. Each of that era's sessions is sent list changes and
// resource updates one after another too (notifySubscribedSessions).
func TestStuckListensDelayNoOne(t *testing.T) {
	f := newReloadFixtureWith(t, &host.Options{Tenants: true}, map[string][]byte{"hostileupdate.wasm": testplugins.Bytes(t, testplugins.Test(t, "hostileupdate"))})
	srv, wl, tokens := stuckServer(t, f)

	var stuck []*watchedConn
	var bobs []*mcp.ClientSession
	for _, b := range stuckBobs {
		body := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"notifications":{"toolsListChanged":true,"resourceSubscriptions":["flood://item/1"]}}}`
		head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Method: subscriptions/listen\r\nMcp-Protocol-Version: 2026-07-28\r\nContent-Length: %d\r\n\r\n%s", srv.Listener.Addr(), tokens[b], len(body), body)
		wc, _ := openStuck(t, srv, wl, head, "acknowledged")
		stuck = append(stuck, wc)
		bobs = append(bobs, connectHTTPEra(t, srv.URL, "2026-07-28", nil, bearer{tokens[b]}))
	}
	changed := make(chan struct{}, 16)
	connectHTTPEra(t, srv.URL, "2026-07-28", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}, bearer{aliceToken})
	fillAll(t, bobs, stuck)

	toldInTime(t, f, changed, "counter.wasm", "counter", "tools/list_changed to alice's listen, past four listens that do not read")
	toldInTime(t, f, changed, "hash.wasm", "hash", "the next tools/list_changed to alice's listen")
}

// stuckTransport sends a bearer token and answers a go-sdk client's
// standing GET with 405, so that the test opens that stream itself.
type stuckTransport struct{ token string }

func (s stuckTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+s.token)
	return noStandingStream{}.RoundTrip(r)
}
