package statestore

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestFileSweep: the periodic sweep drops expired records and fences, and
// keeps live ones.
func TestFileSweep(t *testing.T) {
	ctx := context.Background()
	f, err := NewFile(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := Owner{Replica: "s1", Boot: "a"}
	for id, ttl := range map[string]time.Duration{"short": time.Minute, "long": 48 * time.Hour} {
		c, err := f.Claim(ctx, id, o, ttl, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Put(ctx, id, "f", []byte("v"), c.Fence, ttl); err != nil {
			t.Fatal(err)
		}
	}
	count := func() (recs, fences int) {
		f.db.View(func(tx *bolt.Tx) error {
			recs = tx.Bucket(bucketRecords).Stats().BucketN - 1
			fences = tx.Bucket(bucketFences).Stats().KeyN
			return nil
		})
		return
	}
	start := time.Now()
	for _, step := range []struct {
		after        time.Duration
		recs, fences int
	}{
		{0, 2, 2},
		{2 * time.Minute, 1, 2},          // short's record expired, its fence kept
		{FenceTTL + 2*time.Minute, 1, 1}, // short's fence too
		{49 * time.Hour, 0, 0},           // long's record and fence (its TTL, over FenceTTL)
	} {
		f.now = func() time.Time { return start.Add(step.after) }
		f.sweep()
		if recs, fences := count(); recs != step.recs || fences != step.fences {
			t.Errorf("after %v: %d records, %d fences; want %d, %d", step.after, recs, fences, step.recs, step.fences)
		}
	}
}
