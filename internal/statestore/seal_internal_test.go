package statestore

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// rawBackends are the three backends, opened for a test of the seal's
// versions that reaches into them as someone with write access to the
// store would. Redis's is skipped without redis-server, unless CI is set.
func rawBackends(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"memory": func(t *testing.T) Store { return NewMemory() },
		"file": func(t *testing.T) Store {
			f, err := NewFile(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		},
		"redis": func(t *testing.T) Store {
			r, err := NewRedis("redis://" + proxytest.StartRedis(t) + "/0")
			if err != nil {
				t.Fatal(err)
			}
			r.SetLease(0) // claims here take sessions at once
			t.Cleanup(func() { r.Close() })
			return r
		},
	}
}

// rawRecord is what a backend holds of a record, sealed: its fields, its
// write version and its head.
type rawRecord struct {
	fields  map[string][]byte
	version uint64
	head    []byte
}

func snapshot(t *testing.T, s Store, id string) rawRecord {
	t.Helper()
	fields, version, head, err := s.(versioned).getVersioned(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rawRecord{fields, version, head}
}

// restore writes r's fields, and its version and head when set, over what
// s holds of id, as someone with write access to the store (and without
// the state key) can.
func restore(t *testing.T, s Store, id string, r rawRecord, version, head bool) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch s := s.(type) {
	case *Memory:
		s.mu.Lock()
		rec := s.records[id]
		for k, v := range r.fields {
			rec.fields[k] = v
		}
		if version {
			rec.version = r.version
		}
		if head {
			rec.head = r.head
		}
		s.mu.Unlock()
	case *File:
		err = s.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketRecords).Bucket([]byte(id))
			for k, v := range r.fields {
				if err := b.Put([]byte(k), v); err != nil {
					return err
				}
			}
			if head {
				if err := b.Put(headKey, r.head); err != nil {
					return err
				}
			}
			if version {
				m, _ := readMeta(b)
				m.Version = r.version
				return putMeta(b, m)
			}
			return nil
		})
	case *Redis:
		var kv []any
		for k, v := range r.fields {
			kv = append(kv, "f:"+k, v)
		}
		if version {
			kv = append(kv, "m:v", strconv.FormatUint(r.version, 10))
		}
		if head {
			kv = append(kv, "m:head", r.head)
		}
		err = s.c.HSet(ctx, recKey(id), kv...).Err()
	default:
		t.Fatalf("restore into a %T", s)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestSealVersions: what the seal's versions refuse when someone with
// write access to the store, but not the state key, rolls a record back
// in part (see Seal: protected and not). The seal of before bound a value
// to its ID and field only, with no version: every one of these replays
// opened (TestSealRefusesReplayedValue fails with it).
func TestSealVersions(t *testing.T) {
	ctx := context.Background()
	key := []byte("a state key for tests, 32 bytes!")
	owner := Owner{Replica: "s1", Boot: "a"}
	const long = time.Minute
	for name, open := range rawBackends(t) {
		t.Run(name, func(t *testing.T) {
			raw := open(t)
			// setup writes f (version 1), g (2) and f again (3), and
			// returns the raw record after each write.
			setup := func(t *testing.T, id string) (s Store, fence uint64, after []rawRecord) {
				s = Seal(raw, key)
				if err := s.Heartbeat(ctx, owner, long); err != nil {
					t.Fatal(err)
				}
				c, err := s.Claim(ctx, id, owner, long, false)
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range [][2]string{{"f", "f1"}, {"g", "g1"}, {"f", "f2"}} {
					if err := s.Put(ctx, id, w[0], []byte(w[1]), c.Fence, long); err != nil {
						t.Fatal(err)
					}
					after = append(after, snapshot(t, raw, id))
				}
				if got := after[2].version; got != 3 {
					t.Fatalf("version after three writes = %d, want 3", got)
				}
				return s, c.Fence, after
			}
			wantSealError := func(t *testing.T, what string, err error) {
				t.Helper()
				if !errors.Is(err, ErrSeal) {
					t.Fatalf("%s: %v, want a SealError", what, err)
				}
			}
			get := func(s Store, id string) error {
				got, err := s.Get(ctx, id)
				if err == nil {
					err = errors.New("opened: f=" + string(got["f"]))
				}
				return err
			}

			// Part of a record replayed: f's first value with the version
			// of its write, and with its head too (which does not name g,
			// written since). Refused by every reader, and by the holder.
			for _, withHead := range []bool{false, true} {
				t.Run("value and version replayed, head "+strconv.FormatBool(withHead), func(t *testing.T) {
					id := name + ".value-version-" + strconv.FormatBool(withHead)
					s, fence, after := setup(t, id)
					old := after[0]
					restore(t, raw, id, rawRecord{fields: map[string][]byte{"f": old.fields["f"]}, version: old.version, head: old.head}, true, withHead)
					wantSealError(t, "get", get(s, id))
					wantSealError(t, "another replica's get", get(Seal(raw, key), id))
					wantSealError(t, "the holder's next write", s.Put(ctx, id, "g", []byte("g2"), fence, long))
				})
			}
			t.Run("whole record rolled back", func(t *testing.T) {
				// In step, as of the second write: the holder's next write
				// names the version it wrote last, and is refused.
				id := name + ".whole"
				s, fence, after := setup(t, id)
				restore(t, raw, id, after[1], true, true)
				wantSealError(t, "the holder's next write", s.Put(ctx, id, "g", []byte("g2"), fence, long))
				wantSealError(t, "the holder's write after", s.Put(ctx, id, "f", []byte("f3"), fence, long))
			})
			t.Run("head replayed", func(t *testing.T) {
				id := name + ".head"
				s, _, after := setup(t, id)
				restore(t, raw, id, rawRecord{version: after[2].version, head: after[1].head}, true, true)
				wantSealError(t, "get", get(s, id))
			})
			t.Run("late write", func(t *testing.T) {
				// A write that names a version since replaced (one reported
				// failed, landing late) is refused.
				id := name + ".late"
				_, fence, after := setup(t, id)
				err := raw.(versioned).putVersioned(ctx, id, "f", after[0].fields["f"], after[0].head, fence, 0, long)
				if !errors.Is(err, errVersion) {
					t.Fatalf("a write replacing version 0 of a record at 3: %v, want errVersion", err)
				}
			})
			t.Run("resent write", func(t *testing.T) {
				// The last write sent again, as a client does when the
				// reply was lost (go-redis retries once): applied already,
				// so it succeeds without writing, and the holder's next
				// write is not taken for a rollback. Before, the resent
				// write failed with errVersion, and the session could not
				// be saved again.
				id := name + ".resent"
				s, fence, after := setup(t, id)
				last := after[2]
				if err := raw.(versioned).putVersioned(ctx, id, "f", last.fields["f"], last.head, fence, 2, long); err != nil {
					t.Fatalf("the last write resent: %v, want nil", err)
				}
				if got := snapshot(t, raw, id); got.version != 3 {
					t.Fatalf("version after the resent write = %d, want 3", got.version)
				}
				if err := s.Put(ctx, id, "g", []byte("g2"), fence, long); err != nil {
					t.Fatalf("the holder's next write: %v", err)
				}
				if err := get(s, id); err == nil || !strings.Contains(err.Error(), "opened: f=f2") {
					t.Fatalf("get after: %v, want f2", err)
				}
				// An earlier write resent (its head is not the record's)
				// is still refused.
				if err := raw.(versioned).putVersioned(ctx, id, "f", last.fields["f"], last.head, fence, 2, long); !errors.Is(err, errVersion) {
					t.Fatalf("a write resent after a newer one: %v, want errVersion", err)
				}
			})
			t.Run("concurrent writes of the holder", func(t *testing.T) {
				// Writes of several fields at once, by one process under
				// one fence, are not taken for a rollback.
				id := name + ".concurrent"
				s, fence, _ := setup(t, id)
				var wg sync.WaitGroup
				errs := make(chan error, 8*10)
				for i := range 8 {
					wg.Go(func() {
						for j := range 10 {
							errs <- s.Put(ctx, id, "c"+strconv.Itoa(i), []byte(strconv.Itoa(j)), fence, long)
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatalf("put: %v", err)
					}
				}
				got, err := s.Get(ctx, id)
				if err != nil || len(got) != 10 || string(got["c7"]) != "9" {
					t.Fatalf("get = %q, %v", got, err)
				}
			})
			t.Run("format 1", func(t *testing.T) {
				// A record written before versioned seals opens, and its
				// fields keep opening after the next write; a field
				// written since refuses its older format-1 value.
				id := name + ".v1"
				s := Seal(raw, key).(*sealed)
				v1 := func(field, value string) []byte {
					out := append([]byte{sealV1}, bytes.Repeat([]byte{7}, 12)...)
					return s.aead.Seal(out, out[1:13], []byte(value), sealAD(id, field))
				}
				c, err := s.Claim(ctx, id, owner, long, false)
				if err != nil {
					t.Fatal(err)
				}
				for f, v := range map[string]string{"f": "f1", "g": "g1"} {
					if err := raw.Put(ctx, id, f, v1(f, v), c.Fence, long); err != nil {
						t.Fatal(err)
					}
				}
				want := func(what, f, g string) {
					t.Helper()
					got, err := s.Get(ctx, id)
					if err != nil || string(got["f"]) != f || string(got["g"]) != g {
						t.Fatalf("%s: get = %q, %v; want f=%s g=%s", what, got, err, f, g)
					}
				}
				want("format 1", "f1", "g1")
				if err := s.Put(ctx, id, "f", []byte("f2"), c.Fence, long); err != nil {
					t.Fatal(err)
				}
				want("after a write of f", "f2", "g1")
				if err := raw.Put(ctx, id, "f", v1("f", "f1"), c.Fence, long); err != nil {
					t.Fatal(err)
				}
				wantSealError(t, "f's format-1 value replayed", get(s, id))
			})
		})
	}
}

// FuzzSealOpen: whatever bytes a store holds as a record's field, head
// and version, Get and the next Put through the seal return (a value
// opens only if it was sealed so; else a SealError), never panic.
func FuzzSealOpen(f *testing.F) {
	ctx := context.Background()
	key := []byte("a state key for tests, 32 bytes!")
	owner := Owner{Replica: "s1", Boot: "a"}
	{
		m := NewMemory()
		s := Seal(m, key)
		c, _ := s.Claim(ctx, "id", owner, time.Minute, false)
		s.Put(ctx, "id", "f", []byte("state"), c.Fence, time.Minute)
		r := m.records["id"]
		f.Add(r.fields["f"], r.head, r.version, true)
		f.Add(r.fields["f"], []byte(nil), uint64(0), false)
		f.Add([]byte{sealV1}, []byte{sealV2, 0}, uint64(1<<63), true)
	}
	f.Fuzz(func(t *testing.T, value, head []byte, version uint64, withHead bool) {
		m := NewMemory()
		s := Seal(m, key)
		c, err := s.Claim(ctx, "id", owner, time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Put(ctx, "id", "f", value, c.Fence, time.Minute); err != nil {
			t.Fatal(err)
		}
		if withHead {
			m.records["id"].head, m.records["id"].version = head, version
		}
		if _, err := s.Get(ctx, "id"); err != nil && !errors.Is(err, ErrSeal) {
			t.Fatalf("get: %v, want nil or a SealError", err)
		}
		if err := s.Put(ctx, "id", "g", []byte("next"), c.Fence, time.Minute); err != nil && !errors.Is(err, ErrSeal) {
			t.Fatalf("put: %v, want nil or a SealError", err)
		}
	})
}
