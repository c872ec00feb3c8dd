package statestore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// Regression tests of issue #25's review findings on the store layer.

// redisPair is a Redis store and a raw client of the same server, to
// lose keys behind the store's back as eviction, FLUSHALL or a restart
// without persistence do.
func redisPair(t *testing.T) (statestore.Store, *redis.Client) {
	t.Helper()
	addr := proxytest.StartRedis(t)
	s, err := statestore.NewRedis("redis://" + addr + "/0")
	must(t, err)
	statestore.SetLease(s, 0) // claims here take sessions at once
	t.Cleanup(func() { s.Close() })
	raw := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	return s, raw
}

// Finding 5: the fence counter key lost (evicted) must not hand a new
// owner a fence the stale owner still holds, nor fence the holder out
// for good.
func TestFenceCounterLostKeepsFencing(t *testing.T) {
	s, raw := redisPair(t)
	ctx := context.Background()
	a, b := owners(t)
	id := "finding5"
	must(t, s.Heartbeat(ctx, a, long))
	must(t, s.Heartbeat(ctx, b, long))
	ca, err := s.Claim(ctx, id, a, long, false)
	must(t, err)
	must(t, s.Put(ctx, id, "f", []byte("by a"), ca.Fence, long))
	must(t, raw.Del(ctx, "wt:{"+id+"}:fence").Err())
	// The holder's claim again keeps its fence (it was 0 before: "moved" forever).
	again, err := s.Claim(ctx, id, a, long, false)
	must(t, err)
	if again.Fence != ca.Fence {
		t.Fatalf("holder's claim after the counter was lost: fence %d, want %d", again.Fence, ca.Fence)
	}
	must(t, s.Put(ctx, id, "f", []byte("by a again"), ca.Fence, long))
	must(t, raw.Del(ctx, "wt:{"+id+"}:fence").Err())
	cb, err := s.Claim(ctx, id, b, long, true)
	must(t, err)
	if cb.Fence == ca.Fence {
		t.Fatalf("new owner got the stale owner's fence %d", cb.Fence)
	}
	wantErr(t, "stale owner's put", s.Put(ctx, id, "f", []byte("stale"), ca.Fence, long), statestore.ErrFenced)
	must(t, s.Put(ctx, id, "f", []byte("by b"), cb.Fence, long))
	// Record and counter both evicted: a new claim must still not be
	// the stale owner's fence.
	must(t, raw.Del(ctx, "wt:{"+id+"}:fence", "wt:{"+id+"}:rec").Err())
	cb2, err := s.Claim(ctx, id, b, long, true)
	must(t, err)
	if cb2.Fence == ca.Fence || cb2.Fence == cb.Fence {
		t.Fatalf("claim after the record and counter were evicted: fence %d reused", cb2.Fence)
	}
	wantErr(t, "stale owner's put after eviction", s.Put(ctx, id, "f", []byte("stale"), ca.Fence, long), statestore.ErrFenced)
}

// Finding 2 of "fences the store cannot forget": a store that came back
// empty refuses every older fence with ErrStoreLost (not "fenced"), and
// the holder's next claim works, in a new epoch.
func TestStoreBackEmptyIsDetected(t *testing.T) {
	s, raw := redisPair(t)
	ctx := context.Background()
	a, _ := owners(t)
	id := "flushed"
	must(t, s.Heartbeat(ctx, a, long))
	ca, err := s.Claim(ctx, id, a, long, false)
	must(t, err)
	must(t, s.Put(ctx, id, "f", []byte("v"), ca.Fence, long))
	must(t, raw.FlushAll(ctx).Err())
	wantErr(t, "put after FLUSHALL", s.Put(ctx, id, "f", []byte("v2"), ca.Fence, long), statestore.ErrStoreLost)
	c2, err := s.Claim(ctx, id, a, long, false)
	must(t, err)
	if statestore.Epoch(c2.Fence) == statestore.Epoch(ca.Fence) {
		t.Fatalf("the store came back empty with the same epoch %d", statestore.Epoch(c2.Fence))
	}
	must(t, s.Put(ctx, id, "f", []byte("v2"), c2.Fence, long))
	// The record alone evicted: ErrRecordLost, so the holder writes back.
	must(t, raw.Del(ctx, "wt:{"+id+"}:rec").Err())
	wantErr(t, "put after the record was evicted", s.Put(ctx, id, "f", []byte("v3"), c2.Fence, long), statestore.ErrRecordLost)
}

// A store back empty records, when a caller that saw its earlier epoch
// asks, that it lost that epoch, for the window the caller gives; every
// caller asking then hears of it, whatever epoch it saw. A caller that saw
// none (a brand-new store, a replica started since) records nothing. The
// record says how long ago it was made, by the store's clock: Redis's
// reads the age off its TTL (one aged by shortening it).
// internal/durable tells a client header the store has no record of, and
// that comes within the window, that its state may be lost
// (TestStoreBackEmptyHeaderClientToldReset in host).
func TestStoreBackEmptyLossIsRecorded(t *testing.T) {
	ctx := context.Background()
	const window = time.Hour
	check := func(t *testing.T, s statestore.Store, restart func()) {
		t.Helper()
		e1, lost, err := s.Epoch(ctx, 0, window)
		must(t, err)
		if e1 == 0 || lost.Recorded {
			t.Fatalf("a brand-new store: epoch %d, lost %v", e1, lost)
		}
		c, err := s.Claim(ctx, "x", statestore.Owner{Replica: "a", Boot: "1"}, long, false)
		must(t, err)
		if statestore.Epoch(c.Fence) != e1 {
			t.Fatalf("a claim's epoch %d, the store's %d", statestore.Epoch(c.Fence), e1)
		}
		if e, lost, err := s.Epoch(ctx, e1, window); err != nil || e != e1 || lost.Recorded {
			t.Fatalf("the same store again: %d %v %v", e, lost, err)
		}
		restart()
		// A caller that saw no epoch before: nothing to tell.
		e2, lost, err := s.Epoch(ctx, 0, window)
		must(t, err)
		if e2 == e1 || lost.Recorded {
			t.Fatalf("back empty, asked by a caller that saw none: epoch %d (was %d), lost %v", e2, e1, lost)
		}
		// One that saw e1 records the loss; then everyone hears of it.
		for _, seen := range []uint32{e1, 0, e2} {
			if e, lost, err := s.Epoch(ctx, seen, window); err != nil || e != e2 || !lost.Recorded || lost.Ago < 0 || lost.Ago > window/2 {
				t.Fatalf("back empty, asked having seen %d: %d %+v %v; want %d, lost just now", seen, e, lost, err, e2)
			}
		}
	}
	t.Run("memory", func(t *testing.T) {
		m := statestore.NewMemory()
		check(t, m, m.Flush)
	})
	t.Run("redis", func(t *testing.T) {
		if _, ok := proxytest.Find("redis-server"); !ok {
			proxytest.Binary(t, "redis-server", "redis-server") // fails under CI, else skips
		}
		addr := proxytest.FreeAddr(t)
		p := proxytest.StartRedisAt(t, addr)
		s, err := statestore.Open("redis://"+addr+"/0", testKey)
		must(t, err)
		t.Cleanup(func() { s.Close() })
		check(t, s, func() {
			p.Stop()
			proxytest.StartRedisAt(t, addr)
		})
		raw := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { raw.Close() })
		must(t, raw.PExpire(ctx, "wt:lost", window-10*time.Minute).Err())
		if _, lost, err := s.Epoch(ctx, 0, window); err != nil || !lost.Recorded || lost.Ago < 10*time.Minute || lost.Ago > 11*time.Minute {
			t.Fatalf("the loss's record, 10 min of its window gone: %+v %v; want lost 10 min ago", lost, err)
		}
	})
}

// Finding 7: a write reported failed (it may still be in flight) can
// never land after the holder bumped its fence, which it does before its
// next write.
func TestBumpedFenceRefusesLateWrite(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			ctx := context.Background()
			a, _ := owners(t)
			id := t.Name()
			c, next := writeAndBump(t, s, id, a)
			must(t, s.Put(ctx, id, "f", []byte("2"), next, long))
			// The late write of the old fence lands now: refused.
			wantErr(t, "late write", s.Put(ctx, id, "f", []byte("1 late"), c.Fence, long), statestore.ErrFenced)
			got, err := s.Get(ctx, id)
			must(t, err)
			if string(got["f"]) != "2" {
				t.Fatalf("f = %q, want 2", got["f"])
			}
			// The holder's claim keeps the bumped fence.
			again, err := s.Claim(ctx, id, a, long, false)
			must(t, err)
			if again.Fence != next {
				t.Fatalf("claim after bump = %d, want %d", again.Fence, next)
			}
		})
	}
}

// A bump whose reply was lost is sent again (go-redis resends once after
// a network error; the holder bumps again before its next write): it
// returns the fence it made and changes nothing. Before, the second bump
// was refused as fenced, and the session's calls answered "moved" until
// it was claimed anew. A claim by another owner ends that: the old
// holder's bump, sent again, is refused; so does a claim by the holder
// itself (a request's verify, or a new claim object after the old one was
// forgotten, whose instances the old one's write must not pass for:
// TestForgottenClaimCannotWriteThroughResentBump in durable).
func TestBumpSentAgain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			ctx := context.Background()
			a, o := owners(t)
			id := t.Name()
			c, next := writeAndBump(t, s, id, a)
			again, err := s.Renew(ctx, id, c.Fence, long, true)
			must(t, err)
			if again != next {
				t.Fatalf("the bump sent again = %d, want the first bump's %d", again, next)
			}
			must(t, s.Put(ctx, id, "f", []byte("2"), next, long))
			wantErr(t, "late write of the old fence", s.Put(ctx, id, "f", []byte("1 late"), c.Fence, long), statestore.ErrFenced)
			// The holder claims again: the old fence's bump is refused.
			own, err := s.Claim(ctx, id, a, long, true)
			must(t, err)
			if own.Fence != next || own.Taken != c.Fence || c.Taken != c.Fence {
				t.Fatalf("the holder's claim: %+v, want fence %d taken %d; its first: %+v", own, next, c.Fence, c)
			}
			_, err = s.Renew(ctx, id, c.Fence, long, true)
			wantErr(t, "a bump from the replaced fence after the holder's claim", err, statestore.ErrFenced)
			// Another owner takes the session: neither of the old
			// holder's fences bumps any more.
			must(t, s.Heartbeat(ctx, o, long))
			if other, err := s.Claim(ctx, id, o, long, true); err != nil || other.Taken != other.Fence {
				t.Fatalf("another owner's claim: %+v, %v", other, err)
			}
			_, err = s.Renew(ctx, id, c.Fence, long, true)
			wantErr(t, "the old holder's bump after a claim", err, statestore.ErrFenced)
			_, err = s.Renew(ctx, id, next, long, true)
			wantErr(t, "the old holder's bump of its new fence after a claim", err, statestore.ErrFenced)
		})
	}
}

// A claim says which claim made its caller the holder (Claim.Taken), so
// that a holder whose stealing claim's reply was lost (or was sent again
// by its client, which then answers as the holder's own claim) sees from
// its next claim that someone claimed since the last claim it saw
// answered: itself. Without it, the holder took the store's word that it
// had held the session all along, and served instances from before the
// other owner's writes (TestClaimLostReplyIsNotOwnBump in durable).
func TestClaimTakenNamesTheLastClaim(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			ctx := context.Background()
			a, o := owners(t)
			id := t.Name()
			must(t, s.Heartbeat(ctx, a, long))
			must(t, s.Heartbeat(ctx, o, long))
			mine, err := s.Claim(ctx, id, a, long, false)
			must(t, err)
			_, err = s.Claim(ctx, id, o, long, true)
			must(t, err)
			stolen, err := s.Claim(ctx, id, a, long, true) // its reply is lost
			must(t, err)
			again, err := s.Claim(ctx, id, a, long, true)
			must(t, err)
			if stolen.Taken != stolen.Fence || again.Taken != stolen.Fence || again.Fence != stolen.Fence {
				t.Fatalf("the stealing claim %+v, the next %+v: want both taken at %d", stolen, again, stolen.Fence)
			}
			if again.Taken == mine.Taken {
				t.Fatalf("the claim after another owner's reads as the holder's first: taken %d", again.Taken)
			}
		})
	}
}

// writeAndBump claims id for owner a, writes f=1 and bumps the fence: it
// returns the claim and the bumped fence.
func writeAndBump(t *testing.T, s statestore.Store, id string, a statestore.Owner) (statestore.Claim, uint64) {
	t.Helper()
	ctx := context.Background()
	must(t, s.Heartbeat(ctx, a, long))
	c, err := s.Claim(ctx, id, a, long, false)
	must(t, err)
	must(t, s.Put(ctx, id, "f", []byte("1"), c.Fence, long))
	next, err := s.Renew(ctx, id, c.Fence, long, true)
	must(t, err)
	if next == c.Fence {
		t.Fatal("bump kept the fence")
	}
	return c, next
}

// A process whose state key is not the one the store's values were
// sealed with is told so (issue #25: a replica started with another
// WASMTOOLS_STATE_KEY).
func TestCheckKey(t *testing.T) {
	ctx := context.Background()
	raw := statestore.NewMemory()
	first := statestore.Seal(raw, []byte("the replicas' key"))
	must(t, statestore.CheckKey(ctx, first))
	must(t, statestore.CheckKey(ctx, statestore.Seal(raw, []byte("the replicas' key"))))
	wantErr(t, "another key", statestore.CheckKey(ctx, statestore.Seal(raw, []byte("another key"))), statestore.ErrKeyMismatch)
}

// The state key file is made whole, once, and read back the same.
func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir", "sessions.db.key")
	k1, err := statestore.KeyFile(path)
	must(t, err)
	k2, err := statestore.KeyFile(path)
	must(t, err)
	if string(k1) != string(k2) || len(k1) != 64 {
		t.Fatalf("key %q then %q", k1, k2)
	}
	st, err := os.Stat(path)
	must(t, err)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
