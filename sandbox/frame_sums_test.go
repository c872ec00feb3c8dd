package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestSnapshotFrameSums: the frames a snapshot says it ends with are its
// last bytes, each with the FrameSum of its bytes, which a store trusts
// to tell the frames it keeps already (internal/durable); a frame that
// comes out of the next snapshot the same, and the frames of a restored
// instance's first snapshot, keep their sums.
func TestSnapshotFrameSums(t *testing.T) {
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, c)
	inst := instantiate(t, c)
	check := func(what string, snap []byte, frames []sandbox.Frame) map[uint64][]byte {
		t.Helper()
		total := 0
		for _, f := range frames {
			total += f.Len
		}
		if len(frames) == 0 || total >= len(snap) {
			t.Fatalf("%s: %d frames of %d bytes in a snapshot of %d", what, len(frames), total, len(snap))
		}
		bySum := map[uint64][]byte{}
		at := len(snap) - total
		for k, f := range frames {
			b := snap[at : at+f.Len]
			if got := sandbox.FrameSum(b); got != f.Sum {
				t.Fatalf("%s: frame %d's sum %x, its bytes' %x", what, k, f.Sum, got)
			}
			bySum[f.Sum] = bytes.Clone(b)
			at += f.Len
		}
		return bySum
	}
	var last map[uint64][]byte
	kept := 0
	for k := range 12 {
		if _, err := callServlet(t, inst, "remember", fmt.Sprintf(`{"text":"call %d"}`, k)); err != nil {
			t.Fatal(err)
		}
		snap, frames, err := inst.SnapshotFrames(ctx)
		if err != nil {
			t.Fatal(err)
		}
		now := check(fmt.Sprintf("after call %d", k), snap, frames)
		for sum, b := range now {
			if prev, ok := last[sum]; ok {
				kept++
				if !bytes.Equal(prev, b) {
					t.Fatalf("after call %d: a frame with the sum of one before holds other bytes", k)
				}
			}
		}
		last = now
		if k == 11 {
			fresh, err := c.Restore(ctx, bytes.Clone(snap))
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close(ctx)
			rsnap, rframes, err := fresh.SnapshotFrames(ctx)
			if err != nil {
				t.Fatal(err)
			}
			restored := check("restored", rsnap, rframes)
			if len(restored) != len(now) {
				t.Fatalf("restored: %d frames, the snapshot it came from %d", len(restored), len(now))
			}
			for sum := range now {
				if _, ok := restored[sum]; !ok {
					t.Fatalf("restored: a frame's sum is not the snapshot's it came from")
				}
			}
		}
		inst.ReuseSnapshot(snap)
	}
	if kept == 0 {
		t.Fatal("no frame came out of a snapshot as out of the one before")
	}
}
