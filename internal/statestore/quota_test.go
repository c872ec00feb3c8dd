package statestore_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// quotaReplicas are two replicas' stores of one redis-server (each its
// own connections, one sealed as Open makes it), their owners'
// heartbeats there, and a raw client of the server.
func quotaReplicas(t *testing.T) (a, b statestore.Store, raw *redis.Client) {
	t.Helper()
	addr := proxytest.StartRedis(t)
	a, err := statestore.NewRedis("redis://" + addr + "/0")
	must(t, err)
	b, err = statestore.Open("redis://"+addr+"/0", testKey)
	must(t, err)
	for _, s := range []statestore.Store{a, b} {
		statestore.SetLease(s, 0)
		t.Cleanup(func() { s.Close() })
		if !statestore.Counts(s) {
			t.Fatalf("%T does not count tenants' bytes", s)
		}
	}
	raw = redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	return a, b, raw
}

// put claims id in s and writes n bytes into its field "f" under q.
func put(t *testing.T, s statestore.Store, id string, n int, q statestore.Quota) error {
	t.Helper()
	ctx := context.Background()
	o := statestore.Owner{Replica: "r-" + id, Boot: "1"}
	must(t, s.Heartbeat(ctx, o, long))
	c, err := s.Claim(ctx, id, o, long, true)
	must(t, err)
	return s.Put(statestore.WithQuota(ctx, q), id, "f", bytes.Repeat([]byte("x"), n), c.Fence, long)
}

// wantBudget fails unless err is a refusal by the tenant's budget
// (tenant) or the total's.
func wantBudget(t *testing.T, err error, tenant bool, what string) {
	t.Helper()
	var be *statestore.BudgetError
	if !errors.As(err, &be) || !errors.Is(err, statestore.ErrBudget) || be.Tenant != tenant {
		t.Fatalf("%s: %v, want a refusal by the %s budget", what, err, map[bool]string{true: "tenant's", false: "total"}[tenant])
	}
}

// TestRedisQuotaAcrossReplicas: a tenant's budget holds over what every
// replica sharing the Redis writes (a red team: counted in each
// replica's memory, bob stored his share once per replica), in line and
// out of line; a record rewritten or deleted counts what it holds then,
// and a record that moves to another tenant counts as the new one's.
func TestRedisQuotaAcrossReplicas(t *testing.T) {
	a, b, _ := quotaReplicas(t)
	bob := statestore.Quota{Tenant: "bob", PerTenant: 1000}
	must(t, put(t, a, "q1", 600, bob))
	wantBudget(t, put(t, b, "q2", 600, bob), true, "bob's second 600 bytes through the other replica")
	must(t, put(t, b, "q3", 600, statestore.Quota{Tenant: "alice", PerTenant: 1000}))
	must(t, put(t, a, "q1", 300, bob)) // shrunk
	must(t, put(t, b, "q2", 600, bob))
	wantBudget(t, put(t, a, "q1", 500, bob), true, "bob's first record grown past his share")

	// Deleted: what it held is free.
	ctx := context.Background()
	o := statestore.Owner{Replica: "r-q1", Boot: "1"}
	c, err := a.Claim(ctx, "q1", o, long, true)
	must(t, err)
	must(t, a.Delete(ctx, "q1", c.Fence))
	must(t, put(t, a, "q4", 350, bob))

	// Out of line (16 KiB and more), as a Go guest's state is.
	big := statestore.Quota{Tenant: "carol", PerTenant: 50 << 10}
	must(t, put(t, a, "q5", 20<<10, big))
	must(t, put(t, b, "q6", 20<<10, big))
	wantBudget(t, put(t, a, "q7", 20<<10, big), true, "carol's third 20 KiB")
	must(t, put(t, b, "q5", 20<<10, big)) // the same size again
	must(t, put(t, a, "q5", 1<<10, big))  // in line now
	must(t, put(t, a, "q7", 20<<10, big))

	// q2 is attributed to dave now: bob's share has its bytes back.
	must(t, put(t, b, "q2", 600, statestore.Quota{Tenant: "dave", PerTenant: 1000}))
	must(t, put(t, a, "q8", 600, bob))
	// A replica that does not know whose q8 is (Assumed) writes it as
	// bob's, as the store counts it: past his share.
	anon := statestore.Quota{Tenant: "anon", Assumed: true, PerTenant: 1000}
	wantBudget(t, put(t, b, "q8", 700, anon), true, "bob's record grown by a replica that assumed it was the anonymous pool's")
	must(t, put(t, b, "q10", 700, anon)) // a record of no one's yet: the guess

	// A state written whole beside its old base, which the next write
	// replaces (statestore.Replacing): the base's bytes are not counted
	// against it, or a state of more than half a share could never be
	// written whole again.
	for _, s := range []statestore.Store{a, b} {
		erin := statestore.Quota{Tenant: "erin-" + map[bool]string{true: "a", false: "b"}[s == a], PerTenant: 2000}
		id := "q9-" + erin.Tenant
		must(t, put(t, s, id, 100, erin))
		c, err := s.Claim(ctx, id, statestore.Owner{Replica: "r-" + id, Boot: "1"}, long, false)
		must(t, err)
		qctx := statestore.WithQuota(ctx, erin)
		must(t, s.Put(qctx, id, "b", bytes.Repeat([]byte("b"), 1200), c.Fence, long))
		wantBudget(t, s.Put(qctx, id, "f", bytes.Repeat([]byte("x"), 1000), c.Fence, long), true, "a state written whole beside its base, not replacing it")
		must(t, s.Put(statestore.Replacing(qctx, "b"), id, "f", bytes.Repeat([]byte("x"), 1000), c.Fence, long))
		must(t, s.Put(qctx, id, "b", []byte("b"), c.Fence, long))
		must(t, s.Put(qctx, id, "f", bytes.Repeat([]byte("x"), 1500), c.Fence, long))
	}
}

// TestRedisQuotaRecovers: counts of records the store no longer holds
// (expired, evicted, or the whole store come back empty) refuse no
// write for good: a write past a budget reconciles them first, the
// tenant's own for its budget and every tenant's for the total.
func TestRedisQuotaRecovers(t *testing.T) {
	a, b, raw := quotaReplicas(t)
	ctx := context.Background()
	bob := statestore.Quota{Tenant: "bob", PerTenant: 1000, Total: 2000}
	must(t, put(t, a, "r1", 900, bob))
	wantBudget(t, put(t, b, "r2", 900, bob), true, "bob past his share")
	must(t, raw.Del(ctx, "wt:{r1}:rec").Err()) // expired, or evicted
	must(t, put(t, b, "r2", 900, bob))

	// The total: alice's record and her counts' hash expired together
	// (the hash's TTL is renewed with each of her records').
	alice := statestore.Quota{Tenant: "alice", PerTenant: 1000, Total: 2000}
	carol := statestore.Quota{Tenant: "carol", PerTenant: 1000, Total: 2000}
	must(t, put(t, a, "r3", 900, alice))
	wantBudget(t, put(t, b, "r4", 900, carol), false, "carol past the total")
	if ttl := raw.PTTL(ctx, "wt:q:alice").Val(); ttl <= 0 || ttl > long {
		t.Errorf("alice's counts' TTL is %v, want her record's, %v", ttl, long)
	}
	must(t, raw.Del(ctx, "wt:{r3}:rec", "wt:q:alice").Err())
	must(t, put(t, b, "r4", 900, carol))

	// More stale counts than one write reconciles (about 128, of a hash
	// past 512 entries): each refused write goes on from where the last
	// stopped, so a few writes later frank's share is his again.
	frank := statestore.Quota{Tenant: "frank", PerTenant: 3000}
	var ids []string
	for i := range 1000 {
		id := "frank-" + strconv.Itoa(i)
		must(t, put(t, a, id, 3, frank))
		ids = append(ids, "wt:{"+id+"}:rec")
	}
	must(t, raw.Del(ctx, ids...).Err())
	for try := 1; ; try++ {
		err := put(t, b, "frank-big", 2000, frank)
		if err == nil {
			break
		}
		if !errors.Is(err, statestore.ErrBudget) || try > 1000/100 {
			t.Fatalf("frank's write %d after his 1000 records were gone: %v", try, err)
		}
	}

	// Redis restarted empty.
	must(t, raw.FlushAll(ctx).Err())
	must(t, put(t, a, "r5", 900, bob))
	must(t, put(t, b, "r6", 900, carol))
}

// everyonesQuota is a store whose every write says whose bytes it is, as
// the host's store does (a record it does not know of is the anonymous
// pool's until a request says whose).
type everyonesQuota struct{ statestore.Store }

func (s everyonesQuota) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	return s.Store.Put(statestore.WithQuota(ctx, statestore.Quota{Tenant: "anonymous", Assumed: true, PerTenant: 1 << 20}), id, field, v, fence, ttl)
}

// TestKeyCheckCountsForNoTenant: the store's key check is the operator's
// record, not a tenant's (a red team: through the host's store, which
// says whose every write is, it was counted against the anonymous pool's
// share of the store's bytes, and stretched that pool's count key's TTL
// to the check's 365 days).
func TestKeyCheckCountsForNoTenant(t *testing.T) {
	_, b, raw := quotaReplicas(t)
	ctx := context.Background()
	must(t, statestore.CheckKey(ctx, everyonesQuota{b}))
	if n, err := raw.Exists(ctx, "wt:q:anonymous").Result(); err != nil || n != 0 {
		ttl, _ := raw.PTTL(ctx, "wt:q:anonymous").Result()
		counts, _ := raw.HGetAll(ctx, "wt:q:anonymous").Result()
		t.Errorf("after the key check the anonymous pool's counts are %v (TTL %v); want none", counts, ttl)
	}
	if tenant, err := raw.HGet(ctx, "wt:{wt-keycheck}:rec", "m:t").Result(); err != redis.Nil {
		t.Errorf("the key check's record says it is tenant %q's (%v); want no tenant's", tenant, err)
	}
	// And it is the key check still.
	must(t, statestore.CheckKey(ctx, everyonesQuota{b}))
}
