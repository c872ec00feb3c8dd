package host_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestSessionIDNotLoggedOnStoreError: a stateful session's ID is a
// credential, named in logs by its digest only (TestSessionIDNotLogged).
// The state store's errors name the record, "s." and the raw ID: a
// replica that cannot open a session's sealed record (another state key,
// a record tampered with) logged the ID in "session not taken over".
func TestSessionIDNotLoggedOnStoreError(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", statestore.Seal(store, []byte("the replicas' state key")), sandbox.NewPolicy())
	b := newReplica(t, "b", statestore.Seal(store, []byte("another state key")), sandbox.NewPolicy())
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if res := call(t, cs, "note_add", map[string]any{"text": "kept"}); res.IsError {
		t.Fatal(text(res))
	}
	a.gone()
	rt.point(b)
	cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	b.waitLog(t, "session not taken over", 1)
	if logs := b.log.String(); strings.Contains(logs, strings.TrimPrefix(cs.ID(), "a.")) {
		t.Errorf("the session's ID %s is in b's log:\n%s", cs.ID(), logs)
	}
}
