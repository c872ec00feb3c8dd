package host_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A call's stream resumed (GET with the Last-Event-ID of its POST's
// priming event) while the POST's handler still holds it must not be
// answered 409, which ends the session at the go-sdk client (the fault
// suite's sigstop-past-proxy behind nginx: session-lost, "Conflict"):
// the replica was stopped past the proxy's read timeout, which closed
// the POST's stream, and the client's GET reached the replica as it was
// continued, before it read the close. The GET is the client's: the POST
// is ended, and the GET gets what the POST's client missed and the
// call's result when it comes. Another user's GET of it ends nothing.
// The call here waits for its client's answer (elicitation), so that its
// POST holds the stream throughout.
func TestResumedCallStreamEndsThePostHoldingIt(t *testing.T) {
	addr := proxytest.StartRedis(t)
	f := newFixture(t, &host.Options{Replica: "a", Store: redisStore(t, addr), StateKey: replicaKey, Tenants: true, StreamKeepAlive: time.Second},
		sandbox.NewPolicy(), map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")})
	srv := httptest.NewServer(host.Guard(f.h.HTTPHandler(), host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}}))
	t.Cleanup(srv.Close)
	url := srv.URL + "/mcp"
	logsOnFailure(t, &replica{fixture: f, name: "a", srv: srv})

	send := func(method, token, session, eid, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if eid != "" {
			req.Header.Set("Last-Event-ID", eid)
		}
		resp := sendAs(t, req, token, session)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	opened := send(http.MethodPost, aliceToken, "", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"raw","version":"1"}}}`)
	io.Copy(io.Discard, opened.Body)
	session := opened.Header.Get("Mcp-Session-Id")
	if opened.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %s, session %q", opened.Status, session)
	}
	send(http.MethodPost, aliceToken, session, "", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	add := send(http.MethodPost, aliceToken, session, "", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"item":"x"}}}`)
	if ev := nextEvent(t, bufio.NewReader(add.Body), `"id":2`); !strings.Contains(ev.data, `added \"x\"`) {
		t.Fatalf("add: %s", ev.data)
	}

	del := send(http.MethodPost, aliceToken, session, "", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete","arguments":{"item":"x"}}}`)
	if del.StatusCode != http.StatusOK {
		t.Fatalf("delete: %s", del.Status)
	}
	posted := bufio.NewReader(del.Body)
	prime := nextEvent(t, posted, "")
	if prime.id == "" || prime.data != "" {
		t.Fatalf("the call's stream opened with %+v, want its priming event", prime)
	}
	ask := nextEvent(t, posted, "elicitation/create")

	// Bob's GET of alice's call stream is answered as one of a session
	// unknown (an empty stream, ended), and ends nothing: the POST's
	// stream goes on (its next keep-alive).
	bob := send(http.MethodGet, bobToken, session, prime.id, "")
	for _, ev := range readEvents(t, bob) {
		if ev.data != "" {
			t.Errorf("bob resuming alice's call stream got her event %q", ev.data)
		}
	}
	if bob.StatusCode == http.StatusConflict {
		t.Errorf("bob resuming alice's call stream: HTTP %d, want it answered as a session unknown", bob.StatusCode)
	}
	if line, err := nextLine(posted); err != nil || !strings.HasPrefix(line, ":") {
		t.Fatalf("the call's POST stream after bob's GET: %q, %v; want its next keep-alive (bob ended it)", line, err)
	}

	// Alice's GET, as her client's after the proxy closed the POST's
	// stream that the replica has not seen close.
	get := send(http.MethodGet, aliceToken, session, prime.id, "")
	if get.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(get.Body)
		t.Fatalf("resuming the call's stream while its POST holds it: HTTP %d %q; want 200, the POST ended (409 ends the session at the go-sdk client)", get.StatusCode, strings.TrimSpace(string(b)))
	}
	resumed := bufio.NewReader(get.Body)
	if again := nextEvent(t, resumed, "elicitation/create"); again.id != ask.id {
		t.Errorf("the resumed stream's question: event %q, want %q replayed", again.id, ask.id)
	}
	var q struct{ ID json.RawMessage }
	if err := json.Unmarshal([]byte(ask.data), &q); err != nil {
		t.Fatal(err)
	}
	answer := send(http.MethodPost, aliceToken, session, "", fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"action":"accept","content":{"confirm":true}}}`, q.ID))
	if answer.StatusCode != http.StatusAccepted {
		t.Fatalf("the answer to the question: %s", answer.Status)
	}
	if ev := nextEvent(t, resumed, `"id":3`); !strings.Contains(ev.data, `deleted \"x\"`) {
		t.Errorf("the call's result on the resumed stream: %s", ev.data)
	}
	ended := make(chan struct{})
	go func() {
		io.Copy(io.Discard, posted)
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the call's POST stream still open 10 s after its stream was resumed elsewhere")
	}
}

// nextEvent reads r's events until one whose data contains want ("":
// the first), and returns it.
func nextEvent(t *testing.T, r *bufio.Reader, want string) sseEvent {
	t.Helper()
	var ev sseEvent
	for {
		line, err := nextLine(r)
		if err != nil {
			t.Fatalf("the stream ended before an event with %q: %v", want, err)
		}
		switch {
		case strings.HasPrefix(line, "id:"):
			ev.id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "data:"):
			ev.data += strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		case line == "" && (ev.id != "" || ev.data != ""):
			if strings.Contains(ev.data, want) {
				return ev
			}
			ev = sseEvent{}
		}
	}
}

// nextLine is r's next line, without its end.
func nextLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}
