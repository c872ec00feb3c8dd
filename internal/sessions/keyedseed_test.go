package sessions_test

import (
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestSeededClientRefusedIsNotKept: a Client key's client that Seed made
// (a state store's claim of a new client header value) and whose first
// lease is refused past MaxClients, every client holding a lease, is
// ended then, as a client the lease would have made is never made: kept,
// with no lease it was never idle, so nothing ended it, and each refused
// value was one more client kept for good.
func TestSeededClientRefusedIsNotKept(t *testing.T) {
	w := newWorld(t, sessions.Options{MaxClients: 1})
	defer w.finish()
	busy, err := w.m.Acquire(w.ctx, sessions.Client("a"), w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Done(nil)
	for _, k := range []string{"b", "c", "d"} {
		key := sessions.Client(k)
		if err := w.m.Seed(key, nil, 1); err != nil {
			t.Fatal(err)
		}
		if l, err := w.m.Acquire(w.ctx, key, w.plugin("counter")); !errors.Is(err, sessions.ErrAtCapacity) {
			if err == nil {
				l.Done(nil)
			}
			t.Fatalf("client %s's lease past MaxClients, a's held: %v; want ErrAtCapacity", k, err)
		}
		if w.m.Has(key) {
			t.Errorf("client %s, refused, is kept", k)
		}
	}
	if n := w.m.Stats().Clients; n != 1 {
		t.Errorf("%d clients kept; want a's alone", n)
	}
}
