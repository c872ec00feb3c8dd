package durable

import (
	"context"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// renewCounter is a store that says when a record is renewed.
type renewCounter struct {
	statestore.Store
	renewed chan struct{}
}

func (s *renewCounter) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	f, err := s.Store.Renew(ctx, id, fence, ttl, bump)
	select {
	case s.renewed <- struct{}{}:
	default:
	}
	return f, err
}

// A call's KeepAlive renews its session's record every third of the TTL
// for as long as the call runs, and not once it stopped.
func TestKeepAliveRenewsUntilStopped(t *testing.T) {
	ctx := context.Background()
	store := &renewCounter{Store: statestore.NewMemory(), renewed: make(chan struct{})}
	ses := sessions.New(&sessions.Options{})
	t.Cleanup(func() { ses.Close(ctx) })
	d := New(Options{Store: store, Sessions: ses, Replica: "a", SessionTimeout: 300 * time.Millisecond})
	key := sessions.Client("x")
	c := newClaim(key, StoreID(key))
	cl, err := store.Claim(ctx, c.id, d.owner, time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	c.fence = cl.Fence
	stop := d.KeepAlive(c)
	for i := range 3 { // renewed again and again while the call runs
		select {
		case <-store.renewed:
		case <-time.After(time.Minute):
			t.Fatalf("renewal %d never came", i+1)
		}
	}
	stop()
	// A renewal that had begun may still end after stop; none after it.
	select {
	case <-store.renewed:
	case <-time.After(time.Second): // ten periods
	}
	select {
	case <-store.renewed:
		t.Fatal("renewed after its call ended")
	case <-time.After(time.Second):
	}
}
