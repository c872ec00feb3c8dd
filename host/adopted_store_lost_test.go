package host_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A replica that took a 2025-11-25 session over from the store (its
// initialize replayed from the record) before it could claim it (the
// holder, draining, still held it) claims it only at the session's next
// call. If the store came back empty in between, that claim finds no
// record: the state it took the session over from is lost, and the call
// must say so (stateReset, store-lost), not start the plugin afresh
// unsaid. The fault suite's redis-empty-mid-drain read seven
// acknowledged notes gone, with no reset, this way.
func TestAdoptedSessionStoreBackEmptySaysReset(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	b := newReplica(t, "b", store, sandbox.NewPolicy())
	rt := &router{to: a}
	logsOnFailure(t, a, b)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if res := call(t, cs, "note_add", map[string]any{"text": "one"}); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("note_add at a: %v %s", res.Meta, text(res))
	}
	// b takes the session over from a GET of the session (its standing
	// stream reopened there, as a draining replica asks its clients to),
	// which runs nothing and claims nothing.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.srv.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET of the session at b: %s %s", resp.Status, body)
	}
	cancel()
	resp.Body.Close()
	b.waitLog(t, "session taken over from the state store", 1)
	rt.point(b)
	// a drains (its state saved, its claim released), then the store
	// loses everything.
	if err := a.h.Drain(context.Background(), host.DrainOptions{}); err != nil {
		t.Fatal(err)
	}
	store.Flush()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if err != nil {
		t.Fatalf("note_list at b, the store back empty: %v", err)
	}
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if reset == nil || reset["reason"] != "store-lost" {
		t.Fatalf("note_list at b, the store back empty: %v %q; want a store-lost reset", res.Meta, text(res))
	}
	// Said once: the session goes on at b from there.
	if res := call(t, cs, "note_add", map[string]any{"text": "two"}); res.IsError || res.Meta[host.MetaStateReset] != nil || !strings.Contains(text(res), "note 1 saved") {
		t.Fatalf("note_add at b after the reset: %v %s", res.Meta, text(res))
	}
}
