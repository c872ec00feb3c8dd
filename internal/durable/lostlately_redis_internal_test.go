package durable

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestLostLatelyRecordHeldAMinute: a replica that learns of the store's
// loss from its record (wt:lost, aged by Redis's clock: its window less
// its TTL left) holds back what the store does not hold for lostHold
// after it first read the record, not for as long as the record reads
// as new. A store whose clock went back since the record was written (a
// Sentinel failover to a primary whose clock is behind: Redis 7 hands
// expiries on as absolute times; an NTP step) leaves the record a TTL
// longer than its window, which read as a loss "just now" at every read
// until the clock caught up, each renewing the hold: every session the
// store does not hold, and every made-up ID, answered "not now" (503,
// -32053) by a healthy cluster for the whole step. Modelled by setting
// the record's TTL, as TestStoreBackEmptyLossIsRecorded ages it.
func TestLostLatelyRecordHeldAMinute(t *testing.T) {
	ctx := context.Background()
	addr, p, store, raw := lostRedis(t)

	a := keeperOn(t, store, "a")
	if _, err := a.noteEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	proxytest.StartRedisAt(t, addr) // back empty
	if lost, err := a.noteEpoch(ctx); !lost || err != nil {
		t.Fatalf("a, which saw the earlier epoch: loss recorded %v, %v; want true", lost, err)
	}

	late := keeperOn(t, store, "late") // started since the loss
	// The store's clock went 10 min back just after the record was
	// written: its TTL now outlasts its window by as much.
	if err := raw.PExpire(ctx, "wt:lost", late.ttl()+10*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := late.LostLately(ctx); err != nil {
		t.Fatal(err)
	}
	// A minute on, by the store's clock and by late's (its hold over):
	// the record is that old.
	if err := raw.PExpire(ctx, "wt:lost", late.ttl()+9*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	late.lostUntil.Store(int64(sinceBase() - time.Second))
	if lost, err := late.LostLately(ctx); lost || err != nil {
		t.Errorf("lostHold after late first read the loss's record: LostLately %v, %v; want false (the hold renewed)", lost, err)
	}
}

// TestLostLatelyShortSessionTimeout: with a session timeout under
// lostHold, the store's record of its loss (wt:lost) still lives lostHold,
// so that a replica started 30 s after the loss (a fallback the proxy
// picks) holds back as long as one that saw it: the record lived only the
// session timeout, and the late replica answered unknown a session whose
// replica, cut off from the store alone, would write it back. A client
// header first seen past the session timeout of the loss is still a new
// client, not told of a reset (the record's other use, noteEpoch's
// answer).
func TestLostLatelyShortSessionTimeout(t *testing.T) {
	ctx := context.Background()
	addr, p, store, raw := lostRedis(t)
	const timeout = 20 * time.Second
	keeper := func(replica string) *Keeper {
		ses := sessions.New(&sessions.Options{})
		t.Cleanup(func() { ses.Close(context.Background()) })
		return New(Options{Store: store, Sessions: ses, Replica: replica, SessionTimeout: timeout})
	}

	a := keeper("a")
	if _, err := a.noteEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	proxytest.StartRedisAt(t, addr) // back empty
	if lost, err := a.noteEpoch(ctx); !lost || err != nil {
		t.Fatalf("a, which saw the earlier epoch: loss recorded %v, %v; want true", lost, err)
	}
	left, err := raw.PTTL(ctx, "wt:lost").Result()
	if err != nil {
		t.Fatal(err)
	}
	if left < lostHold-10*time.Second {
		t.Fatalf("the record of the loss lives %v; want about lostHold (%v), not the session timeout (%v)", left, lostHold, timeout)
	}
	// 30 s on by the store's clock: past the session timeout, within
	// lostHold.
	if err := raw.PExpire(ctx, "wt:lost", left-30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	late := keeper("late")
	if lost, err := late.LostLately(ctx); !lost || err != nil {
		t.Errorf("a replica started 30 s after the loss: LostLately %v, %v; want true (within lostHold)", lost, err)
	}
	if lost, err := late.noteEpoch(ctx); lost || err != nil {
		t.Errorf("a client header first seen 30 s after the loss: told of a loss %v, %v; want false (past the session timeout)", lost, err)
	}
}

// lostRedis starts a redis-server on loopback for the tests of a loss's
// record: its address, its process (to stop it and start it again empty
// at the address), a store on it and a plain client of it (to age the
// record).
func lostRedis(t *testing.T) (string, *proxytest.Process, *statestore.Redis, *redis.Client) {
	t.Helper()
	if _, ok := proxytest.Find("redis-server"); !ok {
		proxytest.Binary(t, "redis-server", "redis-server") // fails under CI, else skips
	}
	addr := proxytest.FreeAddr(t)
	p := proxytest.StartRedisAt(t, addr)
	store, err := statestore.NewRedis("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	raw := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	return addr, p, store, raw
}
