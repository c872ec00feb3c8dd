package host_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The store came back empty while a's claim looked current; b served the
// session after that (writing it back under the new epoch) and then
// drained (its claim released, its record kept). a's next contained call
// runs on a's stale instance; its checkpoint's fenced write is refused as
// lost (the old epoch), relost claims the session and finds no holder
// (b released it). a used to write its stale state back over b's and
// send the stale result (a review found it); relost now reads the record
// after its claim, as verify does: it holds plugins' states, so the call
// runs again, claimed first, and is answered from b's.
func TestStaleContainedCallAfterStoreLostAndDrain(t *testing.T) {
	store := statestore.NewMemory()
	a, b, rt, cs := pair(t, store, store)
	add := func(note, want string) {
		t.Helper()
		if res := call(t, cs, "note_add", map[string]any{"text": note}); res.IsError || !strings.Contains(text(res), want) {
			t.Fatalf("note_add %q: %v %s", note, res.Meta, text(res))
		}
	}
	add("one", "note 1 saved")
	add("two", "note 2 saved")
	rt.point(b)
	add("three at b", "note 3 saved") // a's instance is stale now; a does not know
	store.Flush()                     // the store comes back empty
	add("four at b", "note 4 saved")  // b writes the session back under the new epoch
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.h.Drain(ctx, host.DrainOptions{}); err != nil {
		t.Fatalf("b's drain: %v", err)
	}
	rt.point(a)
	res := notes(t, cs, nil)
	if res.IsError || !strings.Contains(text(res), "four at b") {
		t.Fatalf("a read at a after b wrote and drained: %v %s\n(b acknowledged notes 3 and 4)", res.Meta, text(res))
	}
}

// landThenStallStore lands the next plugin-state Put armed for it, then
// holds the caller until its deadline: a write whose answer was lost (a
// Redis script runs on after its caller gave up).
type landThenStallStore struct {
	statestore.Store
	armed atomic.Bool
}

func (s *landThenStallStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if strings.HasPrefix(field, "p/") && s.armed.CompareAndSwap(true, false) {
		if err := s.Store.Put(ctx, id, field, v, fence, ttl); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

// One checkpoint write of a contained call gets no answer (it landed: a
// Redis script runs on after its caller gave up), on a session whose claim
// was last verified more than 2 s before (here the store's timeout, 2.5 s,
// is that long; with the default 1 s, any session idle for 2 s). The call
// ran before its claim was checked, and the claim cannot be checked now
// (the breaker is open): it fails, saying its effect may or may not have
// been kept, never "not kept" (durable.ErrOutcomeUnknown). Its instance is
// kept, and the session goes on, here with the call's effect: not reset
// as not saved (a review found the plugin's whole state reset so).
func TestLostAnswerOfContainedWriteResetsNothing(t *testing.T) {
	store := &landThenStallStore{Store: statestore.NewMemory()}
	a := newFixture(t, &host.Options{Replica: "a", Store: store, StateKey: replicaKey, StoreTimeout: 2500 * time.Millisecond}, sandbox.NewPolicy(),
		map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	srv := httptest.NewServer(a.h.HTTPHandler())
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("a's log:\n%s", a.log.String())
		}
	})
	cs := connectHTTP(t, srv.URL, "2025-11-25", nil)
	for _, n := range []string{"one", "two"} {
		if res := call(t, cs, "note_add", map[string]any{"text": n}); res.IsError {
			t.Fatal(text(res))
		}
	}
	store.armed.Store(true)
	res := call(t, cs, "note_add", map[string]any{"text": "three"})
	if !res.IsError || !strings.Contains(text(res), "may or may not have been kept") {
		t.Errorf("a call whose write got no answer, unverified: %v %s; want a failure whose outcome is unknown", res.Meta, text(res))
	}
	// The breaker closes 2 s after the lost answer: until then the
	// session's requests are refused, to be retried.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
		if err == nil {
			if res.IsError || res.Meta[host.MetaStateReset] != nil || !strings.Contains(text(res), "three") {
				t.Fatalf("the session after one lost answer: %v %s; want the three notes the store holds", res.Meta, text(res))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("note_list still refused: %v", err)
		}
		<-time.After(100 * time.Millisecond)
	}
}
