package statestore

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestResendAfterLandedAppliesOnce: every exchange whose answer is lost
// with its connection, after Redis ran it (proxytest's CutAnswer: the
// command forwarded whole, the connection then reset before its answer),
// is sent again by the store (resend), and the resend applies nothing a
// second time: fence counters, a record's version, head and holder, a
// tenant's byte counts (wt:q:*), the lost mark, heartbeats; a claim
// resent answers what its first send did. Reads resent
// read what is there. With and without wait_replicas (WAIT, a replica
// acknowledging).
func TestResendAfterLandedAppliesOnce(t *testing.T) {
	primary := proxytest.StartRedis(t)
	proxytest.StartRedisReplica(t, primary)
	raw := redis.NewClient(&redis.Options{Addr: primary})
	t.Cleanup(func() { raw.Close() })
	for _, c := range []struct{ name, query string }{{"plain", ""}, {"wait", "?wait_replicas=1"}} {
		t.Run(c.name, func(t *testing.T) {
			bg := context.Background()
			must(t, raw.FlushAll(bg).Err())
			rl := proxytest.StartRelay(t, primary)
			s := openRedis(t, "redis://"+rl.Addr()+"/0"+c.query)
			s.SetLease(0)
			a, x := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "x", Boot: "1"}
			q := WithQuota(bg, Quota{Tenant: "t", PerTenant: 1 << 20})
			// cut runs op with its first send's answer cut (a send that
			// holds marker), and fails the test unless it was cut.
			cut := func(what, marker string, op func() error) {
				t.Helper()
				// Warmed: the script is known by its SHA-1, so the cut
				// send is the one that runs it, not one refused
				// NOSCRIPT.
				done := rl.CutAnswer([]byte(marker))
				err := op()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: no answer was cut", what)
				}
				if err != nil {
					t.Fatalf("%s, its answer cut: %v", what, err)
				}
			}
			hget := func(key, field string) string {
				t.Helper()
				v, err := raw.HGet(bg, key, field).Result()
				if err != nil && err != redis.Nil {
					t.Fatal(err)
				}
				return v
			}
			get := func(key string) string {
				t.Helper()
				v, err := raw.Get(bg, key).Result()
				if err != nil && err != redis.Nil {
					t.Fatal(err)
				}
				return v
			}
			counter := func(id string) uint64 {
				t.Helper()
				n, _ := strconv.ParseUint(get(fenceKey(id)), 10, 64)
				return n
			}
			recFence := func(id string) uint64 {
				t.Helper()
				f, _ := joinFence(hget(recKey(id), "m:epoch"), hget(recKey(id), "m:n"))
				return f
			}
			// Warm every script (and the store's note of it).
			w, err := s.Claim(bg, "warm", a, time.Minute, false)
			must(t, err)
			must(t, s.Put(q, "warm", "f", []byte("w"), w.Fence, time.Minute))
			must(t, s.Put(q, "warm", "g", make([]byte, outOfLine+1), w.Fence, time.Minute))
			must(t, s.putVersioned(q, "warm", "f", []byte("w"), []byte("wh1"), w.Fence, 0, time.Minute))
			must(t, s.putVersioned(q, "warm", "g", make([]byte, outOfLine+1), []byte("wh2"), w.Fence, 1, time.Minute))
			_, err = s.Renew(bg, "warm", w.Fence, time.Minute, true)
			must(t, err)
			_, _, err = s.Epoch(bg, 0, time.Minute)
			must(t, err)
			_, _, _, err = s.readHead(bg, "warm")
			must(t, err)
			_, err = s.Get(bg, "warm")
			must(t, err)
			must(t, s.Release(bg, "warm", w.Fence+1))
			w, err = s.Claim(bg, "warm", a, time.Minute, false)
			must(t, err)
			must(t, s.Delete(bg, "warm", w.Fence))
			must(t, raw.Del(bg, "wt:q:t").Err())
			must(t, raw.Del(bg, "wt:q").Err())

			// A takeover from a dead owner (no heartbeat), and one
			// stolen from a live one: the fence moves once, and the
			// claimant holds the record's.
			for _, steal := range []bool{false, true} {
				id := "claim" + strconv.FormatBool(steal)
				cx, err := s.Claim(bg, id, x, time.Minute, false)
				must(t, err)
				if steal {
					must(t, s.Heartbeat(bg, x, time.Minute))
				}
				var ca Claim
				cut("claim, steal "+strconv.FormatBool(steal), recKey(id), func() (err error) {
					ca, err = s.Claim(bg, id, a, time.Minute, steal)
					return err
				})
				if want := cx.Fence + 1; ca.Fence != want || recFence(id) != want || counter(id) != want&0xffffffff {
					t.Errorf("claim from %v (steal %v), resent: fence %x, the record's %x, the counter %d; want %x (one increment)",
						cx.Fence, steal, ca.Fence, recFence(id), counter(id), want)
				}
				if hget(recKey(id), "m:owner") != ownerKey(a) {
					t.Errorf("claim resent: holder %q", hget(recKey(id), "m:owner"))
				}
				// And it reports the takeover, as its first send did: a
				// claim answered Held tells internal/durable's Ended that
				// no one claimed the session since this replica did, and
				// it deletes the record of the calls the previous holder
				// acknowledged.
				if ca.Held || ca.Previous != x || ca.PreviousAlive != steal || ca.Taken != ca.Fence {
					t.Errorf("claim from x (steal %v), resent: %+v; want the takeover's answer (not Held, Previous x, PreviousAlive %v, Taken the fence)", steal, ca, steal)
				}
			}

			// Writes, in line and out of line, plain and versioned: the
			// tenant's count is the record's bytes, once.
			for _, size := range []int{3, outOfLine + 1} {
				id := "put" + strconv.Itoa(size)
				cl, err := s.Claim(bg, id, a, time.Minute, false)
				must(t, err)
				v := bytes.Repeat([]byte{'p'}, size)
				cut("put", recKey(id), func() error { return s.Put(q, id, "f", v, cl.Fence, time.Minute) })
				cut("versioned put", recKey(id), func() error {
					return s.putVersioned(q, id, "g", v, []byte("head1"), cl.Fence, 0, time.Minute)
				})
				got, err := s.Get(bg, id)
				must(t, err)
				if !bytes.Equal(got["f"], v) || !bytes.Equal(got["g"], v) {
					t.Errorf("%d bytes: the record after resent writes: %d and %d bytes", size, len(got["f"]), len(got["g"]))
				}
				if ver, head := hget(recKey(id), "m:v"), hget(recKey(id), "m:head"); ver != "1" || head != "head1" {
					t.Errorf("%d bytes: version %q head %q after a resent versioned write; want 1, head1", size, ver, head)
				}
				if b := hget(recKey(id), "m:bytes"); b != strconv.Itoa(2*size) {
					t.Errorf("%d bytes: the record's m:bytes %q, want %d", size, b, 2*size)
				}
				if n, _ := raw.Keys(bg, "wt:{"+id+"}:s:*").Result(); len(n) != 0 {
					t.Errorf("%d bytes: staged values left: %v", size, n)
				}
				must(t, s.Release(bg, id, cl.Fence))
			}
			if sum, total := hget("wt:q:t", " sum"), hget("wt:q", " total"); sum != strconv.Itoa(2*3+2*(outOfLine+1)) || total != sum {
				t.Errorf("tenant t's sum %q, the total %q; want %d both", sum, total, 2*3+2*(outOfLine+1))
			}

			// A bump: once.
			cl, err := s.Claim(bg, "renew", a, time.Minute, false)
			must(t, err)
			var bumped uint64
			cut("renew with bump", recKey("renew"), func() (err error) {
				bumped, err = s.Renew(bg, "renew", cl.Fence, time.Minute, true)
				return err
			})
			if want := cl.Fence + 1; bumped != want || recFence("renew") != want || counter("renew") != want&0xffffffff {
				t.Errorf("bump resent: %x, the record's %x, the counter %d; want %x", bumped, recFence("renew"), counter("renew"), want)
			}

			// Release and delete: once; the deleted record's bytes
			// leave the tenant's count once.
			cut("release", recKey("renew"), func() error { return s.Release(bg, "renew", bumped) })
			if o := hget(recKey("renew"), "m:owner"); o != "" {
				t.Errorf("release resent: holder %q", o)
			}
			cd, err := s.Claim(bg, "put3", a, time.Minute, false)
			must(t, err)
			cut("delete", recKey("put3"), func() error { return s.Delete(bg, "put3", cd.Fence) })
			if sum, total := hget("wt:q:t", " sum"), hget("wt:q", " total"); sum != strconv.Itoa(2*(outOfLine+1)) || total != sum {
				t.Errorf("after a resent delete: tenant t's sum %q, the total %q; want %d both", sum, total, 2*(outOfLine+1))
			}
			if _, err := s.Get(bg, "put3"); err != ErrNotFound {
				t.Errorf("deleted record: %v", err)
			}

			// Reads resent.
			var got map[string][]byte
			cut("get", recKey("put"+strconv.Itoa(outOfLine+1)), func() (err error) {
				got, err = s.Get(bg, "put"+strconv.Itoa(outOfLine+1))
				return err
			})
			if len(got["g"]) != outOfLine+1 {
				t.Errorf("get resent: %d bytes", len(got["g"]))
			}
			var ver uint64
			var head []byte
			cut("head", recKey("put"+strconv.Itoa(outOfLine+1)), func() (err error) {
				ver, head, _, err = s.readHead(bg, "put"+strconv.Itoa(outOfLine+1))
				return err
			})
			if ver != 1 || string(head) != "head1" {
				t.Errorf("head resent: %d %q; want 1, head1", ver, head)
			}

			// The epoch: a new one made, and the loss recorded, once.
			old, _, err := s.Epoch(bg, 0, time.Minute)
			must(t, err)
			must(t, raw.Del(bg, epochKey).Err())
			var e uint32
			var lost Loss
			cut("epoch", lostKey, func() (err error) {
				e, lost, err = s.Epoch(bg, old, time.Minute)
				return err
			})
			if !lost.Recorded || get(epochKey) != strconv.FormatUint(uint64(e), 10) || e == old ||
				hget(lostKey, "lost") != strconv.FormatUint(uint64(old), 10) || hget(lostKey, "epoch") != strconv.FormatUint(uint64(e), 10) {
				t.Errorf("epoch resent: %d lost %v; the store's %q, its lost mark %v", e, lost, get(epochKey), raw.HGetAll(bg, lostKey).Val())
			}

			// Heartbeat and leave.
			hb := Owner{Replica: "hb", Boot: "1"}
			cut("heartbeat", ownerKey(hb), func() error { return s.Heartbeat(bg, hb, time.Minute) })
			if get(ownerKey(hb)) != "1" {
				t.Error("heartbeat resent: no heartbeat")
			}
			cut("leave", ownerKey(hb), func() error { return s.Leave(bg, hb) })
			if n := raw.Exists(bg, ownerKey(hb)).Val(); n != 0 {
				t.Error("leave resent: heartbeat still there")
			}
		})
	}
}

// TestResentPutAfterClaim: a write whose answer is lost after Redis ran
// it, and which another replica claims the session between its first
// send and the store's resend of it (CutAnswerThen). Through Open's store
// (sealed: its Put is the backend's versioned write), the one every
// caller has, the resend answers that the write landed. The backend's
// plain Put, which no caller reaches (docs/DESIGN.md), answers ErrFenced
// though its first send landed: pinned, so that a caller it reaches one
// day is seen.
func TestResentPutAfterClaim(t *testing.T) {
	primary := proxytest.StartRedis(t)
	rl := proxytest.StartRelay(t, primary)
	bg := context.Background()
	key := []byte("the replicas' key")
	s, err := Open("redis://"+rl.Addr()+"/0", key)
	must(t, err)
	t.Cleanup(func() { s.Close() })
	raw := s.(*sealed).Store.(*Redis)
	other := Seal(openRedis(t, "redis://"+primary+"/0"), key) // replica b, not through the relay
	for _, st := range []Store{s, other} {
		SetLease(st, 0)
	}
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	for _, c := range []struct {
		name string
		put  func(id string, v []byte, fence uint64) error
		want error
	}{
		{"sealed", func(id string, v []byte, fence uint64) error { return s.Put(bg, id, "f", v, fence, time.Minute) }, nil},
		{"plain", func(id string, v []byte, fence uint64) error { return raw.Put(bg, id, "f", v, fence, time.Minute) }, ErrFenced},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "resent-" + c.name
			ca, err := s.Claim(bg, id, a, time.Minute, false)
			must(t, err)
			// Warmed: the scripts known by their SHA-1, and the sealed
			// store's head of id known, so that the cut send is the
			// write's own.
			must(t, c.put(id, []byte("first"), ca.Fence))
			var claimed error
			done := rl.CutAnswerThen([]byte(recKey(id)), func() {
				_, claimed = other.Claim(bg, id, b, time.Minute, false)
			})
			err = c.put(id, []byte("second"), ca.Fence)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer was cut")
			}
			must(t, claimed)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("a write that landed, resent after b's claim: %v; want %v", err, c.want)
			}
			if c.name == "sealed" {
				rec, err := other.Get(bg, id)
				if err != nil || string(rec["f"]) != "second" {
					t.Errorf("b reads %q (%v); want a's write, which landed", rec["f"], err)
				}
			} else if rec, err := raw.Get(bg, id); err != nil || string(rec["f"]) != "second" {
				t.Errorf("the record holds %q (%v); want a's write, which landed", rec["f"], err)
			}
		})
	}
}
