package host_test

import (
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// sendAs sends req as token's client ("" for none) in session, with the
// 2025-11-25 headers.
func sendAs(t *testing.T, req *http.Request, token, session string) *http.Response {
	t.Helper()
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if req.Method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestStreamReplayFairShares: alice's call ends its stream early
// (close_stream), leaving her result to be resumed with Last-Event-ID.
// Meanwhile bob's ordinary results, some 2.5 MiB of them, past the
// store's 2 MiB here, go through his own session's streams. She still
// resumes her stream and gets her result: each tenant holds its share of
// the replay store, and bob's traffic purges his own events. (A red
// team's, stop 63: the go-sdk's one store, 8 MiB across sessions and
// purging every stream's oldest in turn, lost her one small event to
// his.)
func TestStreamReplayFairShares(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true, MaxStreamReplayBytes: 2 << 20}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	alice := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	post, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_reconnection","arguments":{}}}`))
	last := ""
	for _, e := range readEvents(t, sendAs(t, post, aliceToken, alice.ID())) {
		if e.id != "" {
			last = e.id
		}
	}
	if last == "" {
		t.Fatal("alice's stream had no event ID")
	}
	big := strings.Repeat("b", 60_000) // results are capped at 50 000 runes: 50 are past 2 MiB
	for range 50 {
		call(t, bob, "greet", map[string]any{"name": big})
	}
	get, _ := http.NewRequest(http.MethodGet, url+"/mcp", nil)
	get.Header.Set("Last-Event-ID", last)
	resp := sendAs(t, get, aliceToken, alice.ID())
	got := false
	for _, e := range readEvents(t, resp) {
		if strings.Contains(e.data, "Reconnection test completed successfully") {
			got = true
		}
	}
	if !got {
		t.Errorf("alice resumed her stream after bob's traffic (%s): no result", resp.Status)
	}
}

// liveHeap is the live heap after a collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestStreamReplayStoreBoundsMemory: 4 500 pings in one session, each a
// stream of its own in the replay store, leave the heap as it was, within
// 512 KiB (the store's share is 64 KiB here, counting what a stream
// costs). (A red team's, stop 63: the go-sdk's store kept every stream's
// entry until the session ended, 233 bytes a ping: 1 MB here.)
func TestStreamReplayStoreBoundsMemory(t *testing.T) {
	f := newFixture(t, &host.Options{Tenants: true, MaxStreamReplayBytes: 256 << 10}, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	bob := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
	ping := func(n int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := w; i < n; i += 4 {
					req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":`+strconv.Itoa(i+1)+`,"method":"ping"}`))
					resp := sendAs(t, req, bobToken, bob.ID())
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
	}
	ping(1_000) // past the store's share of bob's: what it holds from now on stays
	before := liveHeap()
	const n = 4_500
	ping(n)
	grew := int64(liveHeap()) - int64(before)
	t.Logf("%d pings in one session: live heap grew %d bytes", n, grew)
	if grew > 512<<10 {
		t.Errorf("bob's %d pings left %d bytes in the host's memory (%d a ping): want the replay store's bound", n, grew, grew/n)
	}
}
