package statestore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestResentWriteAfterOtherWriteLanded: replica a's versioned write lands
// and its reply is lost; b claims the session, reads the record (a's
// write in it) and writes its own; then a's client sends a's write again.
// The resend succeeds without writing, on every backend: the claim kept
// the record's version and head when the holder changed. A review (stop
// 59) found it refused as fenced, which told a that nothing of its call
// landed: a keyless call was run again, applied twice. A write of a's
// that had not landed before b's claim is still refused as fenced, and so
// is any new write under a's fence.
func TestResentWriteAfterOtherWriteLanded(t *testing.T) {
	ctx := context.Background()
	type versioned interface {
		Store
		putVersioned(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration) error
	}
	backends := map[string]func(t *testing.T) versioned{
		"memory": func(*testing.T) versioned { return NewMemory() },
		"file": func(t *testing.T) versioned {
			f, err := NewFile(filepath.Join(t.TempDir(), "s.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		},
		"redis": func(t *testing.T) versioned {
			r, err := NewRedis("redis://" + proxytest.StartRedis(t) + "/0")
			if err != nil {
				t.Fatal(err)
			}
			r.SetLease(0) // claims here take sessions at once
			t.Cleanup(func() { r.Close() })
			return r
		},
	}
	a, b := Owner{Replica: "a", Boot: "1"}, Owner{Replica: "b", Boot: "1"}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			for _, size := range []int{2, outOfLine + 1} {
				id := name + string(rune('0'+size%10))
				value := make([]byte, size)
				ca, err := s.Claim(ctx, id, a, time.Hour, true)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.putVersioned(ctx, id, "f", value, []byte("a's first"), ca.Fence, 0, time.Hour); err != nil {
					t.Fatal(err)
				}
				// a's second write lands; its reply is lost.
				if err := s.putVersioned(ctx, id, "f", value, []byte("a's second"), ca.Fence, 1, time.Hour); err != nil {
					t.Fatal(err)
				}
				cb, err := s.Claim(ctx, id, b, time.Hour, true)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.putVersioned(ctx, id, "f", []byte("b"), []byte("b's"), cb.Fence, 2, time.Hour); err != nil {
					t.Fatal(err)
				}
				if err := s.putVersioned(ctx, id, "f", value, []byte("a's second"), ca.Fence, 1, time.Hour); err != nil {
					t.Errorf("%d bytes: a's write sent again after b claimed and wrote: %v; want it to succeed (it landed)", size, err)
				}
				if rec, err := s.Get(ctx, id); err != nil || string(rec["f"]) != "b" {
					t.Errorf("%d bytes: the record after the resend: %q %v; want b's write", size, rec["f"], err)
				}
				for what, head := range map[string]string{"a's first, resent": "a's first", "a write that never landed": "a's third"} {
					prev := uint64(2)
					if head == "a's first" {
						prev = 0
					}
					if err := s.putVersioned(ctx, id, "f", value, []byte(head), ca.Fence, prev, time.Hour); !errors.Is(err, ErrFenced) {
						t.Errorf("%d bytes: %s under a's fence: %v; want ErrFenced", size, what, err)
					}
				}
			}
		})
	}
}
