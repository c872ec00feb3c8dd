package durable

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// notReplicated is statestore.ErrNotReplicated as the Redis store returns
// it: WAIT answered short (the store answered), or got no answer.
var (
	notReplicatedShort    = fmt.Errorf("statestore: redis: %w", statestore.ErrNotReplicated)
	notReplicatedUnanswer = fmt.Errorf("statestore: redis: %w", errors.Join(statestore.ErrNotReplicated, context.DeadlineExceeded))
)

// TestNotReplicatedClassified: a write the store's primary made but too
// few replicas acknowledged (a Redis URL's wait_replicas) may have landed
// and may be lost at a failover: it is unanswered (its outcome unknown:
// the claim is dirty, the result not saved), never a refusal. WAIT's
// short answer is the store answering: not silent (no hand-over: the
// other replicas meet the same primary), nor a connection refused or
// dropped; WAIT unanswered is silent, as any exchange that met silence.
func TestNotReplicatedClassified(t *testing.T) {
	for _, c := range []errorCase{
		{"WAIT short", notReplicatedShort, false, false, true},
		{"WAIT short, stalled", &stalledError{notReplicatedShort}, false, false, true},
		{"WAIT unanswered", notReplicatedUnanswer, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := refusedConn(c.err); got != c.refused {
				t.Errorf("refusedConn(%v) = %v; want %v", c.err, got, c.refused)
			}
			if got := silent(c.err); got != c.silent {
				t.Errorf("silent(%v) = %v; want %v", c.err, got, c.silent)
			}
			if got := unanswered(c.err); got != c.unanswered {
				t.Errorf("unanswered(%v) = %v; want %v", c.err, got, c.unanswered)
			}
			if Unanswered(c.err) != unanswered(c.err) {
				t.Error("Unanswered is not unanswered")
			}
		})
	}
}

// unreplicatedStore makes the next Put (applied) fail as not replicated,
// and counts fence bumps.
type unreplicatedStore struct {
	statestore.Store
	next  atomic.Bool
	bumps atomic.Int32
}

func (s *unreplicatedStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	err := s.Store.Put(ctx, id, field, v, fence, ttl)
	if err == nil && s.next.CompareAndSwap(true, false) {
		return notReplicatedShort
	}
	return err
}

func (s *unreplicatedStore) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	if bump {
		s.bumps.Add(1)
	}
	return s.Store.Renew(ctx, id, fence, ttl, bump)
}

// TestNotReplicatedWriteBumpsFence: a write that failed as not replicated
// is one whose answer was lost: its field is not counted as saved, the
// breaker opens (the store is not acknowledging writes), and the fence is
// bumped before the next write, so that the write that may have landed on
// a primary that then fails over is never taken for the current one.
func TestNotReplicatedWriteBumpsFence(t *testing.T) {
	st := &unreplicatedStore{Store: statestore.NewMemory()}
	d := New(Options{Store: st, Replica: "a"})
	ctx := context.Background()
	cl, err := st.Claim(ctx, "s", d.owner, time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	c := &Claim{id: "s", fence: cl.Fence, saved: map[string]fieldSum{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	st.next.Store(true)
	if err := d.putLocked(ctx, c, "f", []byte("v1")); !errors.Is(err, statestore.ErrNotReplicated) {
		t.Fatalf("put: %v, want ErrNotReplicated", err)
	}
	if !c.dirty || len(c.saved) != 0 {
		t.Fatalf("after a write not replicated: dirty %v, saved %v; want dirty, nothing saved", c.dirty, c.saved)
	}
	if !d.open() {
		t.Error("the breaker did not open")
	}
	d.downUntil.Store(0)
	if err := d.putLocked(ctx, c, "f", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if st.bumps.Load() != 1 || c.fence <= cl.Fence || c.dirty {
		t.Fatalf("the write after: %d bumps, fence %#x (claimed %#x), dirty %v; want one bump, a higher fence", st.bumps.Load(), c.fence, cl.Fence, c.dirty)
	}
}
