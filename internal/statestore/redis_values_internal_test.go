package statestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRedisValuesOutOfLine checks the keys behind a value of outOfLine
// bytes or more (TestConformance checks what a caller reads): the value
// under its own key and marked in the record, no staged key left behind
// by a write applied, refused or sent again, the value's TTL renewed with
// the record's, its key dropped with the field and the record, and a
// value gone from under its record read as a state that does not open,
// and taken, by a write, a renewal or a claim, for the record lost.
func TestRedisValuesOutOfLine(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	r.SetLease(0) // claims here take sessions at once
	defer r.Close()
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	const id = "s"
	// ttl is not stageTTL, which a renamed value keeps until a script
	// gives it the record's.
	const ttl = 10 * time.Minute
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	for _, o := range []Owner{a, b} {
		must(t, r.Heartbeat(ctx, o, ttl))
	}
	ca, err := r.Claim(ctx, id, a, ttl, false)
	must(t, err)
	big := bytes.Repeat([]byte("v"), outOfLine)

	// valueKeys returns the session's value keys.
	valueKeys := func() []string {
		t.Helper()
		names, err := raw.Keys(ctx, "wt:{"+id+"}:v:*").Result()
		must(t, err)
		return names
	}
	// withRecord fails the test unless every value key expires no
	// sooner than the record (read first: time runs between the reads).
	withRecord := func(what string) {
		t.Helper()
		rec := raw.PTTL(ctx, recKey(id)).Val()
		vals := valueKeys()
		if len(vals) == 0 {
			t.Fatalf("%s: no value key", what)
		}
		for _, k := range vals {
			if v := raw.PTTL(ctx, k).Val(); v < rec-time.Second {
				t.Fatalf("%s: %s expires in %v, its record in %v", what, k, v, rec)
			}
		}
	}
	noStaged := func(what string) {
		t.Helper()
		if staged, _ := raw.Keys(ctx, "wt:{"+id+"}:s:*").Result(); len(staged) > 0 {
			t.Fatalf("%s: staged values left: %v", what, staged)
		}
	}
	field := func(name string) string { return raw.HGet(ctx, recKey(id), name).Val() }

	must(t, r.Put(ctx, id, "p", big, ca.Fence, ttl))
	noStaged("a large put")
	withRecord("a large put")
	if got := raw.Get(ctx, valKey(id, "p")).Val(); got != string(big) {
		t.Fatalf("value key holds %d bytes, want %d", len(got), len(big))
	}
	if field("f:p") != outOfLineMarker || field("o:p") != "1" {
		t.Fatalf("record's fields f:p %.20q, o:p %q: want the marker and 1", field("f:p"), field("o:p"))
	}

	// A small value replaces it in the record and drops its key.
	must(t, r.Put(ctx, id, "p", []byte("small"), ca.Fence, ttl))
	if n := raw.Exists(ctx, valKey(id, "p")).Val(); n != 0 || field("o:p") != "" || field("f:p") != "small" {
		t.Fatalf("after a small put: value key exists %d, o:p %q, f:p %q", n, field("o:p"), field("f:p"))
	}

	// A stale owner's large write is refused and leaves nothing behind.
	must(t, r.Put(ctx, id, "p", big, ca.Fence, ttl))
	cb, err := r.Claim(ctx, id, b, ttl, true)
	must(t, err)
	withRecord("a claim taking the session over")
	stale := bytes.Repeat([]byte("x"), outOfLine+1)
	if err := r.Put(ctx, id, "p", stale, ca.Fence, ttl); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale large put: %v, want ErrFenced", err)
	}
	noStaged("a fenced large put")
	if got := raw.Get(ctx, valKey(id, "p")).Val(); got != string(big) {
		t.Fatal("a fenced put changed the value")
	}

	// The value's TTL follows the record's through every script that
	// sets it: a write of another field, a claim by the holder, each
	// kind of renewal.
	must(t, r.Put(ctx, id, "q", []byte("q"), cb.Fence, 5*time.Second))
	if v := raw.PTTL(ctx, valKey(id, "p")).Val(); v <= 0 || v > 5*time.Second {
		t.Fatalf("value's TTL %v after the record's was set to 5 s", v)
	}
	if _, err := r.Claim(ctx, id, b, ttl, false); err != nil {
		t.Fatal(err)
	}
	withRecord("the holder's claim")
	must(t, r.Put(ctx, id, "q", []byte("q"), cb.Fence, 5*time.Second))
	if _, err := r.Renew(ctx, id, cb.Fence, ttl, false); err != nil {
		t.Fatal(err)
	}
	withRecord("a renewal")
	must(t, r.Put(ctx, id, "q", []byte("q"), cb.Fence, 5*time.Second))
	bumped, err := r.Renew(ctx, id, cb.Fence, ttl, true)
	must(t, err)
	withRecord("a renewal that bumps the fence")
	must(t, r.Put(ctx, id, "q", []byte("q"), bumped, 5*time.Second))
	if again, err := r.Renew(ctx, id, cb.Fence, ttl, true); err != nil || again != bumped {
		t.Fatalf("bump sent again: %d, %v; want %d", again, err, bumped)
	}
	withRecord("a bump sent again")
	cb.Fence = bumped

	// Redis forgot the scripts (restarted, or SCRIPT FLUSH): the write
	// sends the script's text.
	must(t, raw.ScriptFlush(ctx).Err())
	must(t, r.Put(ctx, id, "p", stale, cb.Fence, ttl))
	noStaged("a put after SCRIPT FLUSH")

	// A versioned write sent again after it was applied (a lost reply)
	// succeeds without writing, and drops what it staged.
	v, _, _, err := r.readHead(ctx, id)
	must(t, err)
	for range 2 {
		must(t, r.putVersioned(ctx, id, "p", big, []byte("head"), cb.Fence, v, ttl))
	}
	noStaged("a versioned put sent again")
	if err := r.putVersioned(ctx, id, "p", big, []byte("other"), cb.Fence, v, ttl); !errors.Is(err, errVersion) {
		t.Fatalf("versioned put over another version: %v, want errVersion", err)
	}
	noStaged("a versioned put refused")

	// Deleting the session drops its values.
	must(t, r.Delete(ctx, id, cb.Fence))
	if left := valueKeys(); len(left) > 0 {
		t.Fatalf("value keys left after the session was deleted: %v", left)
	}

	// A value gone from under its record (evicted) reads as a state that
	// does not open, never an empty one; the holder's next write finds
	// the record lost, as if Redis had evicted it all (so the holder
	// writes the session back), and so does a renewal; a claim starts
	// afresh, with a fence past the old one.
	cc, err := r.Claim(ctx, id, b, ttl, false)
	must(t, err)
	// broken writes two large values and deletes the first's key.
	broken := func(fence uint64) {
		t.Helper()
		must(t, r.Put(ctx, id, "p", big, fence, ttl))
		must(t, r.Put(ctx, id, "q", big, fence, ttl))
		must(t, raw.Del(ctx, valKey(id, "p")).Err())
	}
	broken(cc.Fence)
	if _, err := r.Get(ctx, id); !errors.Is(err, ErrSeal) {
		t.Fatalf("get of a record whose value is gone: %v, want ErrSeal", err)
	}
	if _, err := r.Renew(ctx, id, cc.Fence, ttl, false); !errors.Is(err, ErrRecordLost) {
		t.Fatalf("renewal beside a value gone: %v, want ErrRecordLost", err)
	}
	if left := valueKeys(); len(left) > 0 {
		t.Fatalf("value keys left after their record was found broken: %v", left)
	}
	cc, err = r.Claim(ctx, id, b, ttl, false)
	must(t, err)
	broken(cc.Fence)
	if err := r.Put(ctx, id, "r", []byte("r"), cc.Fence, ttl); !errors.Is(err, ErrRecordLost) {
		t.Fatalf("put beside a value gone: %v, want ErrRecordLost", err)
	}
	if left := valueKeys(); len(left) > 0 {
		t.Fatalf("value keys left after their record was found broken: %v", left)
	}
	cd, err := r.Claim(ctx, id, b, ttl, false)
	must(t, err)
	if cd.Fence <= cc.Fence || cd.Previous != (Owner{}) {
		t.Fatalf("claim after the record was dropped = %+v, want a new fence past %d", cd, cc.Fence)
	}
	if _, err := r.Get(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after the record was dropped: %v, want ErrNotFound", err)
	}
	// The same from a claim: a value gone, the next claim starts afresh.
	must(t, r.Put(ctx, id, "p", big, cd.Fence, ttl))
	must(t, raw.Del(ctx, valKey(id, "p")).Err())
	ce, err := r.Claim(ctx, id, b, ttl, false)
	must(t, err)
	if ce.Fence <= cd.Fence {
		t.Fatalf("claim of a record whose value is gone = %+v, want a new fence past %d", ce, cd.Fence)
	}
	if _, err := r.Get(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after a claim dropped the record: %v, want ErrNotFound", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRedisManyValues: a record with more out-of-line values than one
// EXISTS checks (checkValues takes 64 keys at a time): a write renews
// every value's TTL after its record's, and a value gone from the last
// chunk drops the record and the rest of its values.
func TestRedisManyValues(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	must(t, err)
	defer r.Close()
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	const id, ttl, n = "m", 10 * time.Minute, 130
	a := Owner{Replica: "a", Boot: "1"}
	must(t, r.Heartbeat(ctx, a, ttl))
	ca, err := r.Claim(ctx, id, a, ttl, false)
	must(t, err)
	big := bytes.Repeat([]byte("v"), outOfLine)
	for k := range n {
		// Each with a shorter TTL than the last write's.
		must(t, r.Put(ctx, id, fmt.Sprintf("f%03d", k), big, ca.Fence, time.Duration(k+1)*time.Second))
	}
	r.SetLease(0) // claims here take sessions at once
	must(t, r.Put(ctx, id, "small", []byte("x"), ca.Fence, ttl))
	rec := raw.PTTL(ctx, recKey(id)).Val()
	for k := range n {
		if v := raw.PTTL(ctx, valKey(id, fmt.Sprintf("f%03d", k))).Val(); v < rec-time.Second {
			t.Fatalf("value %d expires in %v, its record in %v", k, v, rec)
		}
	}
	must(t, raw.Del(ctx, valKey(id, fmt.Sprintf("f%03d", n-1))).Err())
	if err := r.Put(ctx, id, "small", []byte("y"), ca.Fence, ttl); !errors.Is(err, ErrRecordLost) {
		t.Fatalf("a write beside a value gone from the last chunk: %v; want ErrRecordLost", err)
	}
	if left := raw.Keys(ctx, "wt:{"+id+"}:v:*").Val(); len(left) > 0 {
		t.Fatalf("%d value keys left after the record was dropped", len(left))
	}
}

// TestRedisStagedValueGone: a write out of line whose staged value is not
// there (evicted, or renamed by the same write sent before) answers 6,
// which write reports as a write that may have landed, and writes
// nothing; the script learns it from RENAME's own error.
func TestRedisStagedValueGone(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	must(t, err)
	defer r.Close()
	ctx := context.Background()
	const id, ttl = "g", 10 * time.Minute
	a := Owner{Replica: "a", Boot: "1"}
	must(t, r.Heartbeat(ctx, a, ttl))
	ca, err := r.Claim(ctx, id, a, ttl, false)
	must(t, err)
	e, n := fenceArgs(ca.Fence)
	for name, script := range map[string]*redis.Script{"put": putScripts.outOfLine, "versioned put": putVersionedScripts.outOfLine} {
		keys := []string{recKey(id), fenceKey(id), epochKey, valKey(id, "p"), stageKey(id)}
		args := []any{e, n, "f:p", outOfLineMarker, ms(ttl), fenceMS(ttl), "0", "1", "head"}
		code, err := script.Run(ctx, r.c, keys, args...).Int64()
		if err != nil || code != 6 {
			t.Fatalf("%s with nothing staged: %d %v; want 6", name, code, err)
		}
	}
	r.SetLease(0) // claims here take sessions at once
	rec, err := r.Get(ctx, id)
	if err != nil && !errors.Is(err, ErrNotFound) { // a record of no fields reads as none
		t.Fatal(err)
	}
	if _, ok := rec["p"]; ok {
		t.Fatalf("a write with nothing staged wrote its field: %q", rec["p"])
	}
}

// TestResentWriteAfterClaimLanded: a versioned write whose reply was lost
// is sent again by the client (go-redis, MaxRetries 1); when another
// replica claimed the session between the two sends, the resend still
// finds its own version and head and succeeds without writing, in line
// and out of line, leaving no staged value behind. It was refused as
// fenced, and a writer told that nothing of its call landed ran the call
// again on a record that already held it (a review, stop 57).
func TestResentWriteAfterClaimLanded(t *testing.T) {
	ctx := context.Background()
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	r.SetLease(0) // claims here take sessions at once
	t.Cleanup(func() { r.Close() })
	raw := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	for _, size := range []int{2, outOfLine + 1} {
		id := fmt.Sprintf("s%d", size)
		value := bytes.Repeat([]byte("v"), size)
		ca, err := r.Claim(ctx, id, a, time.Hour, true)
		if err != nil {
			t.Fatal(err)
		}
		head := []byte("head-of-this-write")
		if err := r.putVersioned(ctx, id, "f", value, head, ca.Fence, 0, time.Hour); err != nil {
			t.Fatal(err)
		}
		cb, err := r.Claim(ctx, id, b, time.Hour, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.putVersioned(ctx, id, "f", value, head, ca.Fence, 0, time.Hour); err != nil {
			t.Errorf("%d bytes: the resend of a write that landed, after another claim: %v; want it to succeed", size, err)
		}
		if rec, err := r.Get(ctx, id); err != nil || !bytes.Equal(rec["f"], value) {
			t.Errorf("%d bytes: the record after the resend: %d bytes, %v", size, len(rec["f"]), err)
		}
		if keys, err := raw.Keys(ctx, "wt:{"+id+"}:s:*").Result(); err != nil || len(keys) != 0 {
			t.Errorf("%d bytes: staged values left behind: %v %v", size, keys, err)
		}
		// Another write under the old fence is refused, as ever; the
		// resend still succeeds once the new holder wrote (the claim kept
		// the version and head: TestResentWriteAfterOtherWriteLanded).
		if err := r.putVersioned(ctx, id, "f", []byte("x"), []byte("other head"), ca.Fence, 1, time.Hour); !errors.Is(err, ErrFenced) {
			t.Errorf("%d bytes: a new write under the old fence: %v; want ErrFenced", size, err)
		}
		if err := r.putVersioned(ctx, id, "f", []byte("y"), []byte("b's head"), cb.Fence, 1, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := r.putVersioned(ctx, id, "f", value, head, ca.Fence, 0, time.Hour); err != nil {
			t.Errorf("%d bytes: the resend after the new holder wrote: %v; want it to succeed", size, err)
		}
	}
}

// TestLeaseOutlivesDroppedRecord: the holder's lease is a key of its own
// (wt:{ID}:lease), so a record the store drops, a value of it evicted
// (checkValues, at the claim's start), does not take the lease with it.
// A review found the first version, a field of the record, gone with
// it: another replica then took the session within the holder's grace.
func TestLeaseOutlivesDroppedRecord(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	must(t, err)
	defer r.Close()
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	const id, ttl = "dropped", 10 * time.Minute
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	ca, err := r.Claim(ctx, id, a, ttl, false)
	must(t, err)
	must(t, r.Put(ctx, id, "p/x", bytes.Repeat([]byte("v"), outOfLine), ca.Fence, ttl))
	vals, err := raw.Keys(ctx, "wt:{"+id+"}:v:*").Result()
	must(t, err)
	if len(vals) == 0 {
		t.Fatal("no value kept out of line")
	}
	must(t, raw.Del(ctx, vals...).Err()) // evicted: the next script drops the record
	_, err = r.Claim(ctx, id, b, ttl, true)
	var leased *LeasedError
	if !errors.As(err, &leased) || leased.Wait <= 0 || leased.Wait > Lease {
		t.Fatalf("b's claim within a's lease, the record dropped: %v, want refused for at most %v", err, Lease)
	}
}
