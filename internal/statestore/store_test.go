package statestore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

var testKey = []byte("a state key for tests, 32 bytes!")

// backend opens a fresh store of one kind; the test closes it.
type backend struct {
	name string
	open func(t *testing.T) statestore.Store
}

// backends are every kind of store, plain and as Open returns them
// (sealed), and a Redis primary found through Sentinel whose writes wait
// for its replica. Redis's are skipped without redis-server, unless CI is
// set.
func backends(t *testing.T) []backend {
	// One server for the whole test, started by the test itself: each
	// case uses IDs of its own.
	var redisAddr, sentinelAddr string
	if _, ok := proxytest.Find("redis-server"); ok {
		redisAddr = proxytest.StartRedis(t)
		// A primary with a replica, found through Sentinel, every write
		// waiting for the replica (wait_replicas).
		primary := proxytest.StartRedis(t)
		proxytest.StartRedisReplica(t, primary)
		sentinelAddr, _ = proxytest.StartSentinel(t, "wt", primary, 1)
	}
	redisURL := func(t *testing.T) string {
		if redisAddr == "" {
			proxytest.Binary(t, "redis-server", "redis-server") // fails under CI, else skips
		}
		return "redis://" + redisAddr + "/0"
	}
	sentinelURL := func(t *testing.T) string {
		if sentinelAddr == "" {
			proxytest.Binary(t, "redis-server", "redis-server") // fails under CI, else skips
		}
		return "redis://" + sentinelAddr + "/0?master_name=wt&wait_replicas=1"
	}
	closing := func(t *testing.T, s statestore.Store, err error) statestore.Store {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		statestore.SetLease(s, 0) // but in TestLease
		return s
	}
	return []backend{
		{"memory", func(t *testing.T) statestore.Store { return closing(t, statestore.NewMemory(), nil) }},
		{"file", func(t *testing.T) statestore.Store {
			s, err := statestore.NewFile(filepath.Join(t.TempDir(), "s.db"))
			return closing(t, s, err)
		}},
		{"redis", func(t *testing.T) statestore.Store {
			s, err := statestore.NewRedis(redisURL(t))
			return closing(t, s, err)
		}},
		{"redis-sentinel-wait", func(t *testing.T) statestore.Store {
			s, err := statestore.NewRedis(sentinelURL(t))
			return closing(t, s, err)
		}},
		{"sealed-file", func(t *testing.T) statestore.Store {
			s, err := statestore.Open("file:"+filepath.Join(t.TempDir(), "s.db"), testKey)
			return closing(t, s, err)
		}},
		{"sealed-redis", func(t *testing.T) statestore.Store {
			s, err := statestore.Open(redisURL(t), testKey)
			return closing(t, s, err)
		}},
	}
}

var (
	ownerA = statestore.Owner{Replica: "s1", Boot: "a"}
	ownerB = statestore.Owner{Replica: "s2", Boot: "b"}
)

// owners returns two owners of the test's own: cases share a Redis.
func owners(t *testing.T) (a, b statestore.Owner) {
	return statestore.Owner{Replica: "s1", Boot: t.Name()}, statestore.Owner{Replica: "s2", Boot: t.Name()}
}

const long = time.Minute

// afterTTL returns once a TTL of ttl, set by a call that returned at set,
// has run out on the store's clock, with 5 ms to spare: Redis keeps whole
// milliseconds, and expires a key once its clock is past the expiry.
//
// Why a wait and then one check, not polling: expiry has no event to wait
// on (a store finds it when the record is read), and the stores promise
// it ttl after the call at the latest (their clock is read before the
// call returns), so the check after this wait is deterministic, on a
// loaded machine too (it can only wake later). A poll would also pass an
// expiry seconds late, and what it polls may renew the TTL (a refused
// claim does). An injected clock would skip the wait for Memory and File
// (they read time through a field), but Redis reads its own: this is one
// way for every store.
func afterTTL(set time.Time, ttl time.Duration) {
	time.Sleep(time.Until(set.Add(ttl + 5*time.Millisecond)))
}

// env is one case's store, context and helpers that fail the test.
type env struct {
	t    *testing.T
	a, b statestore.Owner // on two replicas
	s    statestore.Store
	ctx  context.Context
	id   string
}

func (e env) heartbeat(o statestore.Owner, ttl time.Duration) {
	e.t.Helper()
	if err := e.s.Heartbeat(e.ctx, o, ttl); err != nil {
		e.t.Fatal(err)
	}
}

// bothAlive makes both owners alive for long.
func (e env) bothAlive() {
	e.t.Helper()
	e.heartbeat(e.a, long)
	e.heartbeat(e.b, long)
}

// wantClaim fails the test unless got is want.
func (e env) wantClaim(what string, got, want statestore.Claim) {
	e.t.Helper()
	if got != want {
		e.t.Fatalf("%s = %+v, want %+v", what, got, want)
	}
}

func (e env) claim(o statestore.Owner, steal bool) statestore.Claim {
	e.t.Helper()
	c, err := e.s.Claim(e.ctx, e.id, o, long, steal)
	if err != nil {
		e.t.Fatalf("claim by %v: %v", o, err)
	}
	return c
}

func (e env) put(field, value string, fence uint64) error {
	return e.s.Put(e.ctx, e.id, field, []byte(value), fence, long)
}

func (e env) get() map[string]string {
	e.t.Helper()
	got, err := e.s.Get(e.ctx, e.id)
	if err != nil {
		e.t.Fatalf("get: %v", err)
	}
	out := map[string]string{}
	for k, v := range got {
		out[k] = string(v)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

// callEach calls each method of e's store with ctx, and returns their
// errors by name.
func callEach(ctx context.Context, e env) map[string]error {
	s, id := e.s, e.id
	_, errClaim := s.Claim(ctx, id, e.a, long, false)
	_, errGet := s.Get(ctx, id)
	return map[string]error{
		"heartbeat": s.Heartbeat(ctx, e.a, long),
		"leave":     s.Leave(ctx, e.a),
		"claim":     errClaim,
		"put":       s.Put(ctx, id, "f", nil, 1, long),
		"get":       errGet,
		"release":   s.Release(ctx, id, 1),
		"delete":    s.Delete(ctx, id, 1),
	}
}

var cases = []struct {
	name string
	run  func(e env)
}{
	{"round trip", func(e env) {
		e.heartbeat(e.a, long)
		c := e.claim(e.a, false)
		if c.Fence == 0 || c.Previous != (statestore.Owner{}) {
			e.t.Fatalf("first claim = %+v", c)
		}
		must(e.t, e.put("go-sdk", "state", c.Fence))
		must(e.t, e.put("plugin/fmt", "", c.Fence))
		must(e.t, e.put("go-sdk", "state 2", c.Fence))
		if diff := cmp.Diff(map[string]string{"go-sdk": "state 2", "plugin/fmt": ""}, e.get()); diff != "" {
			e.t.Errorf("get (-want +got):\n%s", diff)
		}
		if again := e.claim(e.a, false); again != (statestore.Claim{Fence: c.Fence, Taken: c.Fence, Held: true}) {
			e.t.Errorf("holder's claim again = %+v, want fence %d unchanged, taken by the first claim", again, c.Fence)
		}
		_, err := e.s.Get(e.ctx, e.id+"-other")
		wantErr(e.t, "get of an unknown ID", err, statestore.ErrNotFound)
	}},
	{"claimed without a record", func(e env) {
		e.heartbeat(e.a, long)
		e.claim(e.a, false)
		_, err := e.s.Get(e.ctx, e.id)
		wantErr(e.t, "get of a claim without fields", err, statestore.ErrNotFound)
	}},
	{"held by a live owner", func(e env) {
		e.bothAlive()
		e.claim(e.a, false)
		_, err := e.s.Claim(e.ctx, e.id, e.b, long, false)
		var held *statestore.HeldError
		if !errors.As(err, &held) || held.Holder != e.a || !errors.Is(err, statestore.ErrHeld) {
			e.t.Fatalf("claim of a held session: %v, want a HeldError naming %v", err, e.a)
		}
	}},
	{"takeover after the heartbeat expired", func(e env) {
		e.heartbeat(e.a, 500*time.Millisecond)
		beat := time.Now()
		a := e.claim(e.a, false)
		must(e.t, e.put("f", "by a", a.Fence))
		afterTTL(beat, 500*time.Millisecond)
		b, err := e.s.Claim(e.ctx, e.id, e.b, long, false)
		if err != nil {
			e.t.Fatalf("claim by b once a's heartbeat expired: %v", err)
		}
		e.wantClaim("takeover", b, statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1, Previous: e.a})
		wantErr(e.t, "stale owner's put", e.put("f", "lost", a.Fence), statestore.ErrFenced)
		if got := e.get()["f"]; got != "by a" {
			e.t.Fatalf("f = %q after a fenced put", got)
		}
	}},
	{"takeover after Leave", func(e env) {
		e.heartbeat(e.a, long)
		a := e.claim(e.a, false)
		must(e.t, e.s.Leave(e.ctx, e.a))
		b := e.claim(e.b, false)
		e.wantClaim("takeover", b, statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1, Previous: e.a})
	}},
	{"steal from a live owner", func(e env) {
		e.bothAlive()
		a := e.claim(e.a, false)
		must(e.t, e.put("n", "1", a.Fence))
		b := e.claim(e.b, true)
		e.wantClaim("steal", b, statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1, Previous: e.a, PreviousAlive: true})
		wantErr(e.t, "stale owner's put", e.put("n", "2 by a", a.Fence), statestore.ErrFenced)
		must(e.t, e.put("n", "2 by b", b.Fence))
		if got := e.get()["n"]; got != "2 by b" {
			e.t.Fatalf("n = %q", got)
		}
		// The old owner may steal it back, with a newer fence again.
		if a2 := e.claim(e.a, true); a2.Fence != b.Fence+1 || a2.Previous != e.b {
			e.t.Fatalf("steal back = %+v", a2)
		}
	}},
	{"release", func(e env) {
		e.bothAlive()
		a := e.claim(e.a, false)
		must(e.t, e.put("f", "kept", a.Fence))
		must(e.t, e.s.Release(e.ctx, e.id, a.Fence))
		b := e.claim(e.b, false) // at once, though a is alive
		e.wantClaim("claim after release", b, statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1})
		if got := e.get()["f"]; got != "kept" {
			e.t.Fatalf("f = %q after release", got)
		}
		wantErr(e.t, "put after release", e.put("f", "lost", a.Fence), statestore.ErrFenced)
		must(e.t, e.s.Release(e.ctx, e.id, a.Fence)) // stale: no error, no effect
		must(e.t, e.put("f", "by b", b.Fence))
	}},
	{"delete", func(e env) {
		e.bothAlive()
		a := e.claim(e.a, false)
		must(e.t, e.put("f", "v", a.Fence))
		b := e.claim(e.b, true)
		wantErr(e.t, "stale delete", e.s.Delete(e.ctx, e.id, a.Fence), statestore.ErrFenced)
		must(e.t, e.s.Delete(e.ctx, e.id, b.Fence))
		_, err := e.s.Get(e.ctx, e.id)
		wantErr(e.t, "get after delete", err, statestore.ErrNotFound)
		wantErr(e.t, "put after delete", e.put("f", "v", b.Fence), statestore.ErrFenced)
		wantErr(e.t, "stale put after delete", e.put("f", "v", a.Fence), statestore.ErrFenced)
		if c := e.claim(e.a, false); c.Fence != b.Fence+1 || c.Previous != (statestore.Owner{}) {
			e.t.Fatalf("claim after delete = %+v, want fence %d", c, b.Fence+1)
		}
		must(e.t, e.s.Delete(e.ctx, e.id+"-never", 1)) // no record: nothing to do
	}},
	{"expiry", func(e env) {
		e.bothAlive()
		a, err := e.s.Claim(e.ctx, e.id, e.a, long, false)
		must(e.t, err)
		must(e.t, e.s.Put(e.ctx, e.id, "f", []byte("v"), a.Fence, 500*time.Millisecond))
		afterTTL(time.Now(), 500*time.Millisecond)
		_, err = e.s.Get(e.ctx, e.id)
		wantErr(e.t, "get once the record's TTL ran out", err, statestore.ErrNotFound)
		// The claim went with the record: b claims at once, and the fence
		// goes on counting, so a's stale write is refused.
		b := e.claim(e.b, false)
		e.wantClaim("claim after expiry", b, statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1})
		wantErr(e.t, "stale put after expiry", e.put("f", "v", a.Fence), statestore.ErrFenced)
		// A claim's TTL alone expires too.
		c, err := e.s.Claim(e.ctx, e.id+"-2", e.a, 300*time.Millisecond, false)
		must(e.t, err)
		afterTTL(time.Now(), 300*time.Millisecond)
		_, err = e.s.Claim(e.ctx, e.id+"-2", e.b, long, false)
		must(e.t, err)
		err = e.s.Put(e.ctx, e.id+"-2", "f", nil, c.Fence, long)
		wantErr(e.t, "put after the claim expired", err, statestore.ErrFenced)
	}},
	{"values large and small", func(e env) {
		// Redis keeps a value of 16 KiB or more out of line (redis.go):
		// writes of either size in either direction, a fenced one, and
		// the record's TTL and deletion, read back.
		e.bothAlive()
		a := e.claim(e.a, false)
		big := func(c byte) string { return strings.Repeat(string(c), 40<<10) }
		want := map[string]string{}
		put := func(field, value string, fence uint64) {
			e.t.Helper()
			must(e.t, e.put(field, value, fence))
			want[field] = value
			got := e.get()
			for k := range want {
				if got[k] != want[k] {
					e.t.Fatalf("after putting %d bytes in %s: %s holds %d bytes (%.10q), want %d (%.10q)", len(value), field, k, len(got[k]), got[k], len(want[k]), want[k])
				}
			}
			if len(got) != len(want) {
				e.t.Fatalf("after putting %s: %d fields, want %d", field, len(got), len(want))
			}
		}
		put("f", big('a'), a.Fence)
		put("g", "small", a.Fence)
		put("f", "now small", a.Fence)
		put("f", big('b'), a.Fence)
		put("g", big('c'), a.Fence)
		put("f", big('d'), a.Fence)
		b := e.claim(e.b, true)
		wantErr(e.t, "stale owner's large put", e.put("f", big('x'), a.Fence), statestore.ErrFenced)
		wantErr(e.t, "stale owner's small put", e.put("g", "x", a.Fence), statestore.ErrFenced)
		put("g", "small again", b.Fence)
		put("f", big('e'), b.Fence)
		must(e.t, e.s.Delete(e.ctx, e.id, b.Fence))
		_, err := e.s.Get(e.ctx, e.id)
		wantErr(e.t, "get after delete", err, statestore.ErrNotFound)
		// A large value expires with its record.
		c := e.claim(e.b, false)
		must(e.t, e.s.Put(e.ctx, e.id, "f", []byte(big('f')), c.Fence, long))
		must(e.t, e.s.Put(e.ctx, e.id, "g", []byte(big('g')), c.Fence, 500*time.Millisecond))
		afterTTL(time.Now(), 500*time.Millisecond)
		_, err = e.s.Get(e.ctx, e.id)
		wantErr(e.t, "get once the record's TTL ran out", err, statestore.ErrNotFound)
	}},
	{"cancelled context", func(e env) {
		ctx, cancel := context.WithCancel(e.ctx)
		cancel()
		for name, err := range callEach(ctx, e) {
			wantErr(e.t, name, err, context.Canceled)
		}
	}},
	{"too large", func(e env) {
		e.heartbeat(e.a, long)
		a := e.claim(e.a, false)
		big := make([]byte, statestore.MaxValue+1)
		wantErr(e.t, "put of a value over MaxValue", e.s.Put(e.ctx, e.id, "f", big, a.Fence, long), statestore.ErrTooLarge)
	}},
	{"closed", func(e env) {
		must(e.t, e.s.Close())
		must(e.t, e.s.Close()) // idempotent
		for name, err := range callEach(e.ctx, e) {
			wantErr(e.t, name, err, statestore.ErrClosed)
		}
	}},
}

// TestConformance runs every case against every backend: they must behave
// as Memory does.
func TestConformance(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					a, o := owners(t)
					c.run(env{t: t, s: b.open(t), ctx: context.Background(), id: t.Name(), a: a, b: o})
				})
			}
		})
	}
}

// TestNoLostUpdate: owners on two hosts race to claim (stealing), read,
// increment and write one counter. Every write that succeeded must be
// counted: a write from an owner that lost the claim is fenced, never
// lost over a newer one. (Each goroutine is an owner of its own: writes
// by one owner are the host's to serialise.)
func TestNoLostUpdate(t *testing.T) {
	const (
		perHost = 4
		rounds  = 40
	)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			ctx := context.Background()
			id := "race-" + b.name
			var (
				wg sync.WaitGroup
				mu sync.Mutex
				ok int
			)
			for g := range 2 * perHost {
				owner := statestore.Owner{Replica: fmt.Sprintf("host%d", g%2), Boot: strconv.Itoa(g)}
				must(t, s.Heartbeat(ctx, owner, long))
				wg.Go(func() {
					for range rounds {
						c, err := s.Claim(ctx, id, owner, long, true)
						if err != nil {
							t.Error(err)
							return
						}
						n := 0
						rec, err := s.Get(ctx, id)
						if err == nil {
							n, _ = strconv.Atoi(string(rec["n"]))
						} else if !errors.Is(err, statestore.ErrNotFound) {
							t.Error(err)
							return
						}
						err = s.Put(ctx, id, "n", []byte(strconv.Itoa(n+1)), c.Fence, long)
						switch {
						case err == nil:
							mu.Lock()
							ok++
							mu.Unlock()
						case !errors.Is(err, statestore.ErrFenced):
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			rec, err := s.Get(ctx, id)
			must(t, err)
			if got := string(rec["n"]); got != strconv.Itoa(ok) {
				t.Fatalf("counter = %s after %d successful puts: updates lost", got, ok)
			}
			t.Logf("%d of %d puts succeeded", ok, 2*perHost*rounds)
		})
	}
}

func TestFileReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	f, err := statestore.NewFile(path)
	must(t, err)
	must(t, f.Heartbeat(ctx, ownerA, long))
	a, err := f.Claim(ctx, "id", ownerA, long, false)
	must(t, err)
	must(t, f.Put(ctx, "id", "f", []byte("v"), a.Fence, long))

	_, err = statestore.NewFile(path)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("is in use by another wasmtools")) {
		t.Fatalf("second open: %v, want in use", err)
	}
	must(t, f.Close())

	f, err = statestore.NewFile(path)
	must(t, err)
	defer f.Close()
	rec, err := f.Get(ctx, "id")
	must(t, err)
	if string(rec["f"]) != "v" {
		t.Fatalf("after reopen: %q", rec)
	}
	// a's heartbeat was in the old process: its claim is taken at once.
	b, err := f.Claim(ctx, "id", ownerB, long, false)
	must(t, err)
	if want := (statestore.Claim{Fence: a.Fence + 1, Taken: a.Fence + 1, Previous: ownerA}); b != want {
		t.Fatalf("claim after reopen = %+v, want %+v", b, want)
	}
	wantErr(t, "stale put after reopen", f.Put(ctx, "id", "f", []byte("x"), a.Fence, long), statestore.ErrFenced)
}

// TestRedisContext: a call to a Redis that does not answer ends when its
// ctx does (a deadline, or a cancellation, or the deadline of a context
// only its deadline ends), not at the client's own timeouts.
func TestRedisContext(t *testing.T) {
	addr := proxytest.StartRedis(t)
	s, err := statestore.NewRedis("redis://" + addr + "/0")
	must(t, err)
	defer s.Close()
	// Another connection pauses every client (itself too) for 4 s: longer
	// than both cases take, if they end with their ctx.
	conn, err := net.Dial("tcp", addr)
	must(t, err)
	defer conn.Close()
	fmt.Fprint(conn, "CLIENT PAUSE 4000 ALL\r\n")
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("CLIENT PAUSE: %q, %v", line, err)
	}
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		// A checkpoint's context, which only its deadline ends: the
		// exchange runs on the caller's goroutine, and the socket's
		// deadline, which is the context's, ends it.
		{"detached", func() (context.Context, context.CancelFunc) {
			return statestore.WithTimeout(statestore.Detach(context.Background()), 200*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			start := time.Now()
			_, err := s.Claim(ctx, "id", ownerA, long, false)
			wantErr(t, "claim while Redis is paused", err, c.want)
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Fatalf("claim returned after %v, its ctx ended after 200ms", d)
			}
		})
	}
}

// TestLease: a holder's exchanges with the store (its claim, a write, a
// renewal) refuse another owner's claim for the lease that follows them,
// whether the holder's heartbeat is there or not, steal or no steal; a
// release lifts it, and once it runs out the claim takes the session. A
// holder trusts what it holds for less than the lease without asking
// (internal/durable's memoryGrace): without it, a review found a replica
// writing its older state back over another's acknowledged calls. A File
// store, one process's, grants none.
func TestLease(t *testing.T) {
	for _, b := range backends(t) {
		if strings.Contains(b.name, "file") {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t)
			// Each check must reach the store within the lease of a's
			// exchange before it, on a loaded machine (the backends run
			// in parallel).
			const lease = 3 * time.Second
			statestore.SetLease(s, lease)
			ctx := context.Background()
			a, o := owners(t)
			id := "lease-" + b.name
			leased := func(what string) time.Duration {
				t.Helper()
				_, err := s.Claim(ctx, id, o, long, true)
				var le *statestore.LeasedError
				if !errors.As(err, &le) || !errors.Is(err, statestore.ErrLeased) || le.Holder != a {
					t.Fatalf("%s: another owner's claim: %v, want refused by a's lease", what, err)
				}
				if le.Wait <= 0 || le.Wait > lease {
					t.Fatalf("%s: lease left %v, want within (0, %v]", what, le.Wait, lease)
				}
				return le.Wait
			}
			// No heartbeat: a lease stands without one.
			ca, err := s.Claim(ctx, id, a, long, false)
			must(t, err)
			leased("after a's claim")
			must(t, s.Put(ctx, id, "f", []byte("a"), ca.Fence, long))
			leased("after a's write")
			_, err = s.Renew(ctx, id, ca.Fence, long, false)
			must(t, err)
			time.Sleep(leased("after a's renewal") + 20*time.Millisecond)
			cb, err := s.Claim(ctx, id, o, long, true)
			if err != nil || cb.Previous != a {
				t.Fatalf("claim past the lease: %+v %v, want taken from a", cb, err)
			}
			wantErr(t, "a's write after the session was taken", s.Put(ctx, id, "f", []byte("stale"), ca.Fence, long), statestore.ErrFenced)
			// Released: the lease goes with the hold.
			must(t, s.Release(ctx, id, cb.Fence))
			if _, err := s.Claim(ctx, id, a, long, false); err != nil {
				t.Fatalf("claim of a released session: %v, want taken at once", err)
			}
		})
	}
}
