package host_test

import (
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Regression tests of issue #25 (durable sessions never lose an
// acknowledged write).

// A store that came back empty (a Redis restarted without persistence)
// is detected by its epoch: the replica holding a session writes back
// what it holds, the session's calls go on without "moved", and another
// replica takes the session over with every note. The old code answered
// every call "moved" and started the session empty.
func TestStoreBackEmptySessionGoesOn(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	b := newReplica(t, "b", store, sandbox.NewPolicy())
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("a's log:\n%s\nb's log:\n%s", a.log.String(), b.log.String())
		}
	})
	for _, n := range []string{"one", "two"} {
		if res := call(t, cs, "note_add", map[string]any{"text": n}); res.IsError {
			t.Fatal(text(res))
		}
	}
	store.Flush()
	res := call(t, cs, "note_add", map[string]any{"text": "three"})
	if res.IsError || !strings.Contains(text(res), "note 3 saved") || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("call after the store came back empty: %v %s", res.Meta, text(res))
	}
	a.waitLog(t, "state store lost the session's record", 1)
	a.gone()
	rt.point(b)
	list := text(notes(t, cs, nil))
	for _, n := range []string{"one", "two", "three"} {
		if !strings.Contains(list, n) {
			t.Fatalf("note %q lost after the store came back empty and the session moved:\n%s", n, list)
		}
	}
}

// A call whose state could not be saved says so in its result
// (_meta notSaved), rather than answering as if it were durable. The old
// code said nothing: the client's next call on another replica had lost
// it silently.
func TestNotSavedIsMarked(t *testing.T) {
	store := statestore.NewMemory()
	a := newReplica(t, "a", store, sandbox.NewPolicy())
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	if res := call(t, cs, "note_add", map[string]any{"text": "kept"}); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a saved call: %v %s", res.Meta, text(res))
	}
	store.Close()
	res := call(t, cs, "note_add", map[string]any{"text": "not kept"})
	m, ok := res.Meta[host.MetaNotSaved].(map[string]any)
	if res.IsError || !ok || m["reason"] != "store-unavailable" {
		t.Fatalf("a call with the store gone: meta %v, %s; want notSaved store-unavailable", res.Meta, text(res))
	}
}
