package durable

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestLostLately: a replica that saw the store's epoch change holds back,
// for lostHold and no longer, what the store does not hold: LostLately
// says so, reading the epoch itself when it saw no change (a handover
// may come before its heartbeat's next round), and a handle neither it
// nor the store knows is refused for now (ErrStateUnavailable), read
// before it is claimed: no record of this replica's claim is left, from
// which the replica that still holds the handle's session would take it
// over as handed on and start it afresh unsaid. Past lostHold the handle
// is unknown, as before.
func TestLostLately(t *testing.T) {
	ctx := context.Background()
	mem, d := epochSeen(t)
	if lost, err := d.LostLately(ctx); lost || err != nil {
		t.Fatalf("no loss: LostLately %v, %v", lost, err)
	}
	mem.Flush() // back empty: a new epoch, which no heartbeat read yet
	if lost, err := d.LostLately(ctx); !lost || err != nil {
		t.Fatalf("the store back empty: LostLately %v, %v; want true", lost, err)
	}
	key := sessions.Handle("h1", "test")
	if _, err := d.Ensure(ctx, key, nil); !errors.Is(err, ErrStateUnavailable) || !errors.Is(err, errLostLately) {
		t.Fatalf("an unknown handle within lostHold of the loss: %v; want refused for now", err)
	}
	if rec, err := mem.Get(ctx, StoreID(key)); len(rec) != 0 || !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("the refused handle's record: %v, %v; want none (no claim)", rec, err)
	}
	if d.open() {
		t.Fatal("the refusal opened the breaker: the store answered")
	}
	d.lostUntil.Store(int64(sinceBase() - time.Second))
	mem.by = lostHold // the store's record of the loss as old
	if lost, err := d.LostLately(ctx); lost || err != nil {
		t.Fatalf("past lostHold: LostLately %v, %v; want false", lost, err)
	}
	if c, err := d.Ensure(ctx, key, nil); c != nil || err != nil {
		t.Fatalf("an unknown handle past lostHold: %v, %v; want unknown (nil, nil)", c, err)
	}
}

// TestLostLatelyHandleBeforeHeartbeat: a handle's takeover that comes
// after the store came back empty but before this replica's heartbeat
// read the new epoch (2 s apart; none while the store was down) is
// refused for now too, read before it is claimed, as a stateful session's
// is (the host reads the epoch on finding no record): claimed, the handle
// leaves a record from which its holder, cut off from the store alone,
// back, takes the session over as handed on, its state gone unsaid.
func TestLostLatelyHandleBeforeHeartbeat(t *testing.T) {
	ctx := context.Background()
	mem, d := epochSeen(t)
	mem.Flush() // back empty: a new epoch, which nothing here read yet
	key := sessions.Handle("h1", "test")
	if c, err := d.Ensure(ctx, key, nil); !errors.Is(err, ErrStateUnavailable) || !errors.Is(err, errLostLately) {
		t.Errorf("an unknown handle right after the loss, before a heartbeat: %v, %v; want refused for now", c, err)
	}
	if rec, err := mem.Get(ctx, StoreID(key)); len(rec) != 0 || !errors.Is(err, statestore.ErrNotFound) {
		t.Errorf("the handle's record: %v, %v; want none (no claim)", rec, err)
	}
}

// epochSeen is a keeper of replica "b" on a memory store, which has read
// the store's epoch once (as its heartbeat's last round would have).
func epochSeen(t *testing.T) (*agedLoss, *Keeper) {
	t.Helper()
	mem := &agedLoss{Memory: statestore.NewMemory()}
	d := keeperOn(t, mem, "b")
	if _, err := d.noteEpoch(context.Background()); err != nil {
		t.Fatal(err)
	}
	return mem, d
}

// TestLostLatelyStartedAfterLoss: a replica started after the store came
// back empty never saw the earlier epoch, but another replica that did
// recorded the loss in the store (noteEpoch): the late one holds back
// what the store does not hold as that one does, within lostHold of the
// loss. Answered unknown, a session whose replica is cut off from the
// store alone, and would write it back, ends at the client: a fallback
// the proxy picks may be one restarted or added since the loss.
func TestLostLatelyStartedAfterLoss(t *testing.T) {
	ctx := context.Background()
	mem, c := epochSeen(t)
	mem.Flush()
	if lost, err := c.LostLately(ctx); !lost || err != nil {
		t.Fatalf("c, which saw the earlier epoch: LostLately %v, %v; want true", lost, err)
	}
	b := keeperOn(t, mem, "late") // no epoch read yet: just started
	if lost, err := b.LostLately(ctx); !lost || err != nil {
		t.Errorf("b, started after the loss c recorded: LostLately %v, %v; want true", lost, err)
	}
	key := sessions.Handle("h1", "test")
	if c, err := b.Ensure(ctx, key, nil); !errors.Is(err, ErrStateUnavailable) || !errors.Is(err, errLostLately) {
		t.Errorf("an unknown handle at b within lostHold of the loss: %v, %v; want refused for now", c, err)
	}
	if rec, err := mem.Get(ctx, StoreID(key)); len(rec) != 0 || !errors.Is(err, statestore.ErrNotFound) {
		t.Errorf("the refused handle's record: %v, %v; want none (no claim)", rec, err)
	}
	// One started once the store's record of the loss is lostHold old
	// (by the store's clock) finds the handle unknown, as before.
	mem.by = lostHold
	later := keeperOn(t, mem, "later")
	if lost, err := later.LostLately(ctx); lost || err != nil {
		t.Errorf("a replica started lostHold after the loss: LostLately %v, %v; want false", lost, err)
	}
	if c, err := later.Ensure(ctx, key, nil); c != nil || err != nil {
		t.Errorf("an unknown handle lostHold after the loss: %v, %v; want unknown (nil, nil)", c, err)
	}
}

// agedLoss is a memory store whose record of its loss reads as made by
// more ago (by the store's clock) than it was.
type agedLoss struct {
	*statestore.Memory
	by time.Duration
}

func (s *agedLoss) Epoch(ctx context.Context, seen uint32, window time.Duration) (uint32, statestore.Loss, error) {
	e, loss, err := s.Memory.Epoch(ctx, seen, window)
	if loss.Recorded {
		loss.Ago += s.by
	}
	return e, loss, err
}

// keeperOn is a keeper of replica on store, which has not read the
// store's epoch yet.
func keeperOn(t *testing.T, store statestore.Store, replica string) *Keeper {
	t.Helper()
	ses := sessions.New(&sessions.Options{})
	t.Cleanup(func() { ses.Close(context.Background()) })
	return New(Options{Store: store, Sessions: ses, Replica: replica})
}
