package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestListenStreamEndNotToldToGoSDKClient pins what DEPLOY.md says of
// the go-sdk client (v1.8.0) in the 2026-07-28 era: when the server ends
// its subscriptions/listen stream (here a drain of the replica behind
// the client's URL, which then routes to another), the client neither
// listens again nor learns that it stopped listening: no request of its
// own follows, a later tools/list_changed never reaches it, and its
// session goes on. The stream carries no event ID in that era, and the
// go-sdk ends a call's stream that ended without one (handleSSE), while
// the listen call itself is never awaited (callSubscriptionsListen). What
// it can rely on is the list it asks for: tools/list is served
// uncached (TTL 0) and current. Should a go-sdk release listen again or
// fail the session, this test fails and DEPLOY.md's text is to change.
func TestListenStreamEndNotToldToGoSDKClient(t *testing.T) {
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	a := newReloadFixture(t, map[string][]byte{"counter.wasm": counter})
	b := newReloadFixture(t, map[string][]byte{"counter.wasm": counter})
	var toB atomic.Bool
	listenEnded := make(chan struct{}, 4) // a's listen streams served
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if toB.Load() {
			b.h.HTTPHandler().ServeHTTP(w, r)
			return
		}
		a.h.HTTPHandler().ServeHTTP(w, r)
		if r.Header.Get("Mcp-Method") == "subscriptions/listen" {
			listenEnded <- struct{}{}
		}
	}))
	t.Cleanup(srv.Close)

	// The client under test counts its requests; a second client,
	// listening at b throughout, says when b sent the notification.
	sent := new(requestCounter)
	changed, witnessed := make(chan struct{}, 4), make(chan struct{}, 4)
	cs := connectHTTPEra(t, srv.URL, "2026-07-28", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}, sent)
	ended := make(chan struct{})
	go func() { cs.Wait(); close(ended) }()
	call(t, cs, "count", nil)
	// Listening at a: a change there reaches the client.
	a.deploy(t, "notes.wasm", testplugins.Bytes(t, testplugins.Example(t, "notes")))
	notified(t, changed, "tools/list_changed from a, where the client listens")

	toB.Store(true)
	connectHTTPEra(t, srv.URL, "2026-07-28", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { witnessed <- struct{}{} }}, nil)
	before := sent.Load()
	drainPromptly(t, a.fixture, "a client listening for list changes")
	notified(t, listenEnded, "the end of a's listen stream, at its drain")
	// The go-sdk would come back 1 to 2 s after the end (its first
	// reconnection delay): 5 s is well past it.
	select {
	case <-time.After(5 * time.Second):
	case <-ended:
		t.Fatal("the client's session ended with its listen stream")
	}
	if n := sent.Load() - before; n != 0 {
		t.Fatalf("the client sent %d requests after its listen stream ended; DEPLOY.md says it sends none", n)
	}

	b.deploy(t, "hash.wasm", testplugins.Bytes(t, testplugins.Example(t, "hash")))
	notified(t, witnessed, "tools/list_changed from b, to a client listening there")
	select {
	case <-changed:
		t.Fatal("the client whose listen stream ended got tools/list_changed; DEPLOY.md says it never does")
	case <-time.After(3 * time.Second):
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(res.Tools) != 3 {
		t.Fatalf("tools after the change, listed: %v, %v; want 3", res, err)
	}
	if got := text(call(t, cs, "count", nil)); got == "" {
		t.Fatal("no answer to a call after the listen stream ended")
	}
}

// notified waits for a signal on ch (what it is), up to 30 s.
func notified(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no signal: %s", what)
	}
}

// requestCounter counts the HTTP requests it carries.
type requestCounter struct{ atomic.Int32 }

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestListenEndsGoSDKClientIgnores: whatever ends a 2026-07-28 client's
// listen stream (the graceful SubscriptionsListenResult, an error
// response, a close event asking it back, or a 503 to the listen
// itself), the go-sdk client (v1.8.0) neither listens again nor ends its
// session (Connect succeeds even when the listen is refused). So no
// answer of the host's tells such a client, as DEPLOY.md says. The
// listen is answered by the test, the rest by the host.
func TestListenEndsGoSDKClientIgnores(t *testing.T) {
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	for _, end := range []string{"result", "error", "close-retry", "503"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			f := newReloadFixture(t, map[string][]byte{"counter.wasm": counter})
			var listens atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Mcp-Method") != "subscriptions/listen" {
					if r.Method != http.MethodPost {
						listens.Add(1) // a GET: the go-sdk coming back
					}
					f.h.HTTPHandler().ServeHTTP(w, r)
					return
				}
				listens.Add(1)
				if end == "503" {
					w.Header().Set("Retry-After", "1")
					http.Error(w, "this replica is shutting down", http.StatusServiceUnavailable)
					return
				}
				var m struct {
					ID json.RawMessage `json:"id"`
				}
				if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
					t.Error(err)
				}
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/subscriptions/acknowledged\",\"params\":{\"_meta\":{\"io.modelcontextprotocol/subscriptionId\":%s},\"notifications\":{\"toolsListChanged\":true}}}\n\n", m.ID)
				switch end {
				case "result":
					fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"resultType\":\"complete\",\"_meta\":{\"io.modelcontextprotocol/subscriptionId\":%s}}}\n\n", m.ID, m.ID)
				case "error":
					fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32603,\"message\":\"this replica is shutting down\"}}\n\n", m.ID)
				case "close-retry":
					fmt.Fprint(w, "event: close\nretry: 500\ndata:\n\n")
				}
			}))
			t.Cleanup(srv.Close)
			cs := connectHTTPEra(t, srv.URL, "2026-07-28", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {}}, nil)
			ended := make(chan struct{})
			go func() { cs.Wait(); close(ended) }()
			// Past the go-sdk's first reconnection delay (1 to 2 s, or
			// the 0.5 s asked).
			select {
			case <-time.After(4 * time.Second):
			case <-ended:
				t.Fatal("the client's session ended with its listen stream")
			}
			if n := listens.Load(); n != 1 {
				t.Fatalf("%d listens or GETs; want the one listen, never again", n)
			}
			if got := text(call(t, cs, "count", nil)); got == "" {
				t.Fatal("no answer to a call")
			}
		})
	}
}
