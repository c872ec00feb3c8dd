package durable

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// hangingStore answers as its store does until hang is set; then every
// Release waits for its deadline, as a store behind a blackholed link.
type hangingStore struct {
	statestore.Store
	hang     atomic.Bool
	releases atomic.Int32
}

func (s *hangingStore) Release(ctx context.Context, id string, fence uint64) error {
	if !s.hang.Load() {
		return s.Store.Release(ctx, id, fence)
	}
	s.releases.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// A drain past its grace (its context ended: a call outlasted it) still
// saves and releases the sessions whose calls are over, each exchange
// under the store's own timeout; but once an exchange went unanswered
// (the breaker open), it asks no more: with the store away, each
// session's release would wait the store's timeout in turn, and a
// replica with thousands of sessions would take as many seconds to exit,
// where its claims expire with its heartbeat anyway. Within the grace,
// the context bounds the whole.
func TestDrainPastGraceStopsAskingAnAwayStore(t *testing.T) {
	ctx := context.Background()
	ses := sessions.New(&sessions.Options{})
	t.Cleanup(func() { ses.Close(ctx) })
	st := &hangingStore{Store: statestore.NewMemory()}
	d := New(Options{Store: st, Sessions: ses, Replica: "a", StoreTimeout: 200 * time.Millisecond})
	const n = 8
	for i := range n {
		if _, err := d.Ensure(ctx, sessions.Client(fmt.Sprint("s", i)), &NewSession{Initialize: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	st.hang.Store(true)
	ended, cancel := context.WithCancel(ctx)
	cancel() // the grace has run out
	if err := d.Drain(ended); err != nil {
		t.Logf("drain: %v", err)
	}
	if got := st.releases.Load(); got != 1 {
		t.Fatalf("%d releases asked of a store that answered none, past the grace; want 1 (then the breaker keeps the rest)", got)
	}
}
