package host_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// sseEvent is one event of an SSE stream.
type sseEvent struct{ id, data, retry string }

// readEvents reads an SSE stream to its end.
func readEvents(t *testing.T, resp *http.Response) []sseEvent {
	t.Helper()
	defer resp.Body.Close()
	var out []sseEvent
	var e sseEvent
	started := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if started {
				out = append(out, e)
			}
			e, started = sseEvent{}, false
			continue
		}
		started = true
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimPrefix(v, " ")
		switch k {
		case "id":
			e.id = v
		case "data":
			e.data += v
		case "retry":
			e.retry = v
		}
	}
	if started {
		out = append(out, e)
	}
	return out
}

// postInSession POSTs a JSON-RPC message by hand on a 2025-11-25 session.
func postInSession(t *testing.T, url, session, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(body))
	return sendAs(t, req, "", session)
}

// On a 2025-11-25 session every SSE stream opens with a priming event (an
// ID, no data); a guest's close_stream ends its call's stream with a retry
// field before the result, and the client that reconnects with
// Last-Event-ID gets the result. As the suite's server-sse-polling does
// it, by hand, and then with the go-sdk client, which reconnects itself.
func TestSSEPrimingAndRetry(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "2025-11-25", nil)
	if cs.ID() == "" {
		t.Fatal("no session")
	}
	events := readEvents(t, postInSession(t, url, cs.ID(), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_reconnection","arguments":{}}}`))
	if len(events) == 0 || events[0].id == "" || events[0].data != "" {
		t.Fatalf("POST stream %+v: want a priming event (an ID, no data) first", events)
	}
	last := ""
	retry := false
	for _, e := range events {
		if strings.Contains(e.data, `"result"`) {
			t.Fatalf("POST stream carried the result %q: the guest closed it first", e.data)
		}
		if e.retry == "100" {
			retry = true
		}
		if e.id != "" {
			last = e.id
		}
	}
	if !retry {
		t.Errorf("POST stream %+v: no retry field of 100 ms", events)
	}
	get, _ := http.NewRequest(http.MethodGet, url+"/mcp", nil)
	get.Header.Set("Accept", "text/event-stream")
	get.Header.Set("Mcp-Session-Id", cs.ID())
	get.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	get.Header.Set("Last-Event-ID", last)
	// The resumed stream ends once it has delivered the call's response.
	resp, err := http.DefaultClient.Do(get)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET with Last-Event-ID: %s", resp.Status)
	}
	got := false
	for _, e := range readEvents(t, resp) {
		if strings.Contains(e.data, "Reconnection test completed successfully") {
			got = true
		}
	}
	if !got {
		t.Error("the resumed stream did not carry the call's result")
	}

	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_reconnection", Arguments: map[string]any{}})
	if err != nil || !strings.HasPrefix(text(res), "Reconnection test completed successfully") {
		t.Errorf("go-sdk client: %v %v; want the result after reconnecting", res, err)
	}
	// 2026-07-28 has no resumable streams: close_stream does nothing, and
	// the result comes on the request's own stream.
	modern := connectHTTP(t, url, "2026-07-28", nil)
	if res := call(t, modern, "test_reconnection", nil); !strings.HasPrefix(firstText(res), "Reconnection test completed successfully") {
		t.Errorf("2026-07-28: %q", firstText(res))
	}
}
