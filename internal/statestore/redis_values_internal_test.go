package statestore

import (
	"bytes"
	"context"
	"errors"
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
// value gone from under its record read as a state that does not open.
func TestRedisValuesOutOfLine(t *testing.T) {
	addr := proxytest.StartRedis(t)
	r, err := NewRedis("redis://" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	const id = "s"
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	for _, o := range []Owner{a, b} {
		must(t, r.Heartbeat(ctx, o, time.Minute))
	}
	ca, err := r.Claim(ctx, id, a, time.Minute, false)
	must(t, err)
	big := bytes.Repeat([]byte("v"), outOfLine)

	// keys reports which of the session's keys exist, with their TTLs.
	keys := func() map[string]time.Duration {
		t.Helper()
		names, err := raw.Keys(ctx, "wt:{"+id+"}:*").Result()
		must(t, err)
		out := map[string]time.Duration{}
		for _, k := range names {
			out[k] = raw.PTTL(ctx, k).Val()
		}
		return out
	}
	noStaged := func(what string) {
		t.Helper()
		if staged, _ := raw.Keys(ctx, "wt:{"+id+"}:s:*").Result(); len(staged) > 0 {
			t.Fatalf("%s: staged values left: %v", what, staged)
		}
	}
	field := func(name string) string { return raw.HGet(ctx, recKey(id), name).Val() }

	must(t, r.Put(ctx, id, "p", big, ca.Fence, time.Minute))
	noStaged("a large put")
	if got := raw.Get(ctx, valKey(id, "p")).Val(); got != string(big) {
		t.Fatalf("value key holds %d bytes, want %d", len(got), len(big))
	}
	if field("f:p") != outOfLineMarker || field("o:p") != "1" {
		t.Fatalf("record's fields f:p %.20q, o:p %q: want the marker and 1", field("f:p"), field("o:p"))
	}

	// A small value replaces it in the record and drops its key.
	must(t, r.Put(ctx, id, "p", []byte("small"), ca.Fence, time.Minute))
	if n := raw.Exists(ctx, valKey(id, "p")).Val(); n != 0 || field("o:p") != "" || field("f:p") != "small" {
		t.Fatalf("after a small put: value key exists %d, o:p %q, f:p %q", n, field("o:p"), field("f:p"))
	}

	// A stale owner's large write is refused and leaves nothing behind.
	must(t, r.Put(ctx, id, "p", big, ca.Fence, time.Minute))
	cb, err := r.Claim(ctx, id, b, time.Minute, true)
	must(t, err)
	stale := bytes.Repeat([]byte("x"), outOfLine+1)
	if err := r.Put(ctx, id, "p", stale, ca.Fence, time.Minute); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale large put: %v, want ErrFenced", err)
	}
	noStaged("a fenced large put")
	if got := raw.Get(ctx, valKey(id, "p")).Val(); got != string(big) {
		t.Fatal("a fenced put changed the value")
	}

	// The value's TTL follows the record's: a put with a short TTL
	// shortens both, a claim renews both.
	must(t, r.Put(ctx, id, "q", []byte("q"), cb.Fence, 5*time.Second))
	if ttl := keys()[valKey(id, "p")]; ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("value's TTL %v after the record's was set to 5 s", ttl)
	}
	if _, err := r.Claim(ctx, id, b, time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if ttl := keys()[valKey(id, "p")]; ttl <= 5*time.Second {
		t.Fatalf("value's TTL %v after a claim of a minute", ttl)
	}
	if _, err := r.Renew(ctx, id, cb.Fence, 2*time.Minute, false); err != nil {
		t.Fatal(err)
	}
	if ttl := keys()[valKey(id, "p")]; ttl <= time.Minute {
		t.Fatalf("value's TTL %v after a renewal of two minutes", ttl)
	}

	// Redis forgot the scripts (restarted, or SCRIPT FLUSH): the write
	// sends the script's text.
	must(t, raw.ScriptFlush(ctx).Err())
	must(t, r.Put(ctx, id, "p", stale, cb.Fence, time.Minute))
	noStaged("a put after SCRIPT FLUSH")

	// A versioned write sent again after it was applied (a lost reply)
	// succeeds without writing, and drops what it staged.
	v, _, _, err := r.readHead(ctx, id)
	must(t, err)
	for range 2 {
		must(t, r.putVersioned(ctx, id, "p", big, []byte("head"), cb.Fence, v, time.Minute))
	}
	noStaged("a versioned put sent again")
	if err := r.putVersioned(ctx, id, "p", big, []byte("other"), cb.Fence, v, time.Minute); !errors.Is(err, errVersion) {
		t.Fatalf("versioned put over another version: %v, want errVersion", err)
	}
	noStaged("a versioned put refused")

	// A value gone from under its record (evicted) is a state that does
	// not open, not an empty one.
	must(t, raw.Del(ctx, valKey(id, "p")).Err())
	if _, err := r.Get(ctx, id); !errors.Is(err, ErrSeal) {
		t.Fatalf("get of a record whose value is gone: %v, want ErrSeal", err)
	}

	// Deleting the session drops its values.
	must(t, r.Put(ctx, id, "p", big, cb.Fence, time.Minute))
	must(t, r.Delete(ctx, id, cb.Fence))
	for k := range keys() {
		if k != recKey(id) && k != fenceKey(id) {
			t.Fatalf("key %s left after the session was deleted", k)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
