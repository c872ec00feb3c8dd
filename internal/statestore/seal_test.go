package statestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

func TestSeal(t *testing.T) {
	ctx := context.Background()
	a := statestore.Owner{Replica: "s1", Boot: "a"}
	// raw is what the backend holds; s seals into it.
	// fence is id2's fence, fence1 id1's.
	var fence1 uint64
	setup := func(t *testing.T) (raw *statestore.Memory, s statestore.Store, fence uint64) {
		raw = statestore.NewMemory()
		s = statestore.Seal(raw, testKey)
		must(t, s.Heartbeat(ctx, a, long))
		for _, id := range []string{"id1", "id2"} {
			c, err := s.Claim(ctx, id, a, long, false)
			must(t, err)
			must(t, s.Put(ctx, id, "f", []byte("secret "+id), c.Fence, long))
			must(t, s.Put(ctx, id, "g", []byte("other "+id), c.Fence, long))
			fence1, fence = fence, c.Fence
		}
		return raw, s, fence
	}
	wantSealError := func(t *testing.T, s statestore.Store, id, field string) {
		t.Helper()
		_, err := s.Get(ctx, id)
		var se *statestore.SealError
		if !errors.As(err, &se) || se.ID != id || se.Field != field || !errors.Is(err, statestore.ErrSeal) {
			t.Fatalf("get: %v, want a SealError for %s %s", err, id, field)
		}
	}

	t.Run("round trip", func(t *testing.T) {
		raw, s, _ := setup(t)
		got, err := s.Get(ctx, "id1")
		must(t, err)
		if string(got["f"]) != "secret id1" || string(got["g"]) != "other id1" {
			t.Fatalf("get = %q", got)
		}
		stored, _ := raw.Get(ctx, "id1")
		if strings.Contains(string(stored["f"]), "secret") {
			t.Fatalf("stored in the clear: %q", stored["f"])
		}
	})
	t.Run("tampered", func(t *testing.T) {
		raw, s, _ := setup(t)
		stored, _ := raw.Get(ctx, "id1")
		v := stored["f"]
		v[len(v)-20] ^= 1
		must(t, raw.Put(ctx, "id1", "f", v, fence1, long))
		wantSealError(t, s, "id1", "f")
	})
	t.Run("moved to another session", func(t *testing.T) {
		raw, s, fence := setup(t)
		stored, _ := raw.Get(ctx, "id1")
		must(t, raw.Put(ctx, "id2", "f", stored["f"], fence, long))
		wantSealError(t, s, "id2", "f")
	})
	t.Run("moved to another field", func(t *testing.T) {
		raw, s, fence := setup(t)
		stored, _ := raw.Get(ctx, "id2")
		must(t, raw.Put(ctx, "id2", "g", stored["f"], fence, long))
		wantSealError(t, s, "id2", "g")
	})
	t.Run("truncated", func(t *testing.T) {
		raw, s, fence := setup(t)
		must(t, raw.Put(ctx, "id2", "g", []byte{1, 2, 3}, fence, long))
		wantSealError(t, s, "id2", "g")
	})
	t.Run("another key", func(t *testing.T) {
		raw, _, _ := setup(t)
		other := statestore.Seal(raw, []byte("another state key"))
		_, err := other.Get(ctx, "id1")
		if !errors.Is(err, statestore.ErrSeal) {
			t.Fatalf("get with another key: %v, want a SealError", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		_, s, _ := setup(t)
		big := make([]byte, statestore.MaxValue-statestore.SealOverhead+1)
		wantErr(t, "put", s.Put(ctx, "id1", "f", big, fence1, long), statestore.ErrTooLarge)
		must(t, s.Put(ctx, "id1", "f", big[1:], fence1, long)) // the largest that fits
	})
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	t.Run("unknown scheme", func(t *testing.T) {
		_, err := statestore.Open("postgres://u:secret@db/x", testKey)
		if err == nil || !strings.Contains(err.Error(), `"postgres"`) || strings.Contains(err.Error(), "secret") {
			t.Fatalf("open postgres://: %v, want an error naming the scheme only", err)
		}
	})
	t.Run("no key", func(t *testing.T) {
		if _, err := statestore.Open("file:"+filepath.Join(t.TempDir(), "s.db"), nil); err == nil {
			t.Fatal("open without a state key: no error")
		}
	})
	for _, form := range []string{"file:", "file://"} {
		t.Run(form+"PATH", func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			s, err := statestore.Open(form+path, testKey)
			must(t, err)
			defer s.Close()
			if _, err := os.Stat(path); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("default file", func(t *testing.T) {
		dir := t.TempDir()
		t.Setenv("XDG_STATE_HOME", dir)
		s, err := statestore.Open("file", testKey)
		must(t, err)
		a := statestore.Owner{Replica: "s1", Boot: "a"}
		c, err := s.Claim(ctx, "id", a, long, false)
		must(t, err)
		must(t, s.Put(ctx, "id", "f", []byte("v"), c.Fence, long))
		must(t, s.Close())
		for path, want := range map[string]os.FileMode{
			filepath.Join(dir, "wasmtools"):             0o700 | os.ModeDir,
			filepath.Join(dir, "wasmtools/sessions.db"): 0o600,
		} {
			fi, err := os.Stat(path)
			must(t, err)
			if fi.Mode() != want {
				t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
			}
		}
	})
}

// An older value of a field, replayed into it by someone who can write
// to the store but has not the state key (from a backup, or an earlier
// read), does not open: its seal names the record's write version it was
// written at, and the record's sealed head names the field's current one
// (issue #25, finding 12). The seal of before (the ID and field only)
// opened it, rolling the guest's state back unnoticed.
func TestSealRefusesReplayedValue(t *testing.T) {
	ctx := context.Background()
	for _, b := range backends(t) {
		if strings.HasPrefix(b.name, "sealed-") {
			continue // the raw backends: the test seals them itself
		}
		t.Run(b.name, func(t *testing.T) {
			raw := b.open(t)
			s := statestore.Seal(raw, testKey)
			a, _ := owners(t)
			id := "replay." + b.name
			must(t, s.Heartbeat(ctx, a, long))
			c, err := s.Claim(ctx, id, a, long, false)
			must(t, err)
			must(t, s.Put(ctx, id, "f", []byte("state 1"), c.Fence, long))
			old, err := raw.Get(ctx, id) // the sealed value, as Redis holds it
			must(t, err)
			must(t, s.Put(ctx, id, "f", []byte("state 2"), c.Fence, long))
			must(t, raw.Put(ctx, id, "f", old["f"], c.Fence, long)) // replayed
			got, err := s.Get(ctx, id)
			var se *statestore.SealError
			if !errors.As(err, &se) || se.ID != id || se.Field != "f" {
				t.Fatalf("get after the replay = %q, %v; want a SealError for field f", got, err)
			}
		})
	}
}
