package host

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/plugins"
)

// TestHandlePathAllocates: what a 2026-07-28 call with a session handle
// costs the host per request beside the go-sdk's own work (issue 27, item
// 3): the request's _meta, all of it the protocol's envelope and the
// handle, is dropped without a copy (a map before); a handle's check (its
// MAC, its subject's, its client's key) and the split of its argument
// allocate only what they return.
func TestHandlePathAllocates(t *testing.T) {
	h := New(plugins.NewStatic(nil), nil)
	t.Cleanup(func() { h.Close(context.Background()) })
	envelope := mcp.Meta{
		MetaSession:                   "wt1.x.-.y",
		mcp.MetaKeyProtocolVersion:    "2026-07-28",
		mcp.MetaKeyClientInfo:         map[string]any{"name": "c", "version": "1"},
		mcp.MetaKeyClientCapabilities: map[string]any{},
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if m := withoutHandle(envelope); len(m) != 0 {
			t.Fatalf("withoutHandle kept %v", m)
		}
	}); allocs > 0 {
		t.Errorf("withoutHandle of the envelope and the handle: %v allocations; want none", allocs)
	}
	if raceEnabled {
		t.Skip("the race detector drops pooled HMACs")
	}
	for _, subject := range []string{"", "alice"} {
		ref, err := h.mint(subject, false)
		if err != nil {
			t.Fatal(err)
		}
		args := json.RawMessage(`{"text":"` + strings.Repeat("x", 50) + `","` + SessionArgument + `":"` + ref.handle + `"}`)
		var got clientRef
		allocs := testing.AllocsPerRun(100, func() {
			_, presented, err := splitSessionArgument(args)
			if err != nil {
				t.Fatal(err)
			}
			if got, err = h.handleClient(subject, presented, false); err != nil || got.refused != nil {
				t.Fatal(err, got.refused)
			}
		})
		if got.key != ref.key {
			t.Fatalf("subject %q: the handle's key is %v, want %v", subject, got.key, ref.key)
		}
		// The arguments without the handle, the handle and its key's
		// label (6 and 7 before: the MACs' input and sum, the label's
		// pieces, the handle itself moved to the heap).
		if allocs > 3 {
			t.Errorf("subject %q: a handle's split and check: %v allocations; want 3", subject, allocs)
		}
	}
}
