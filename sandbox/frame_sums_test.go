package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestSnapshotFrameSums: the frames a snapshot gives in parts each come
// with the FrameSum of its bytes, which a store trusts to tell the frames
// it keeps already (internal/durable); a frame that comes out of the next
// snapshot the same, and the frames of a restored instance's first
// snapshot, keep their sums; the parts joined restore; and the frames'
// bytes, the instance's, are never written over by its later snapshots.
func TestSnapshotFrameSums(t *testing.T) {
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, c)
	inst := instantiate(t, c)
	check := func(what string, head []byte, frames []sandbox.Frame) map[uint64][]byte {
		t.Helper()
		if len(frames) == 0 || len(head) == 0 {
			t.Fatalf("%s: a head of %d bytes and %d frames", what, len(head), len(frames))
		}
		bySum := map[uint64][]byte{}
		for k, f := range frames {
			if got := sandbox.FrameSum(f.Bytes); got != f.Sum {
				t.Fatalf("%s: frame %d's sum %x, its bytes' %x", what, k, f.Sum, got)
			}
			bySum[f.Sum] = f.Bytes
		}
		return bySum
	}
	join := func(head []byte, frames []sandbox.Frame) []byte {
		b := bytes.Clone(head)
		for _, f := range frames {
			b = append(b, f.Bytes...)
		}
		return b
	}
	// given holds every frame returned, as returned and as it was then.
	type frame struct{ got, was []byte }
	var given []frame
	var last map[uint64][]byte
	kept := 0
	for k := range 12 {
		if _, err := callServlet(t, inst, "remember", fmt.Sprintf(`{"text":"call %d"}`, k)); err != nil {
			t.Fatal(err)
		}
		head, frames, err := inst.SnapshotParts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		now := check(fmt.Sprintf("after call %d", k), head, frames)
		for sum, b := range now {
			if prev, ok := last[sum]; ok {
				kept++
				if !bytes.Equal(prev, b) {
					t.Fatalf("after call %d: a frame with the sum of one before holds other bytes", k)
				}
			}
			given = append(given, frame{b, bytes.Clone(b)})
		}
		last = now
		if k == 11 {
			fresh, err := c.Restore(ctx, join(head, frames))
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close(ctx)
			if d := sandbox.DifferingBytes(fresh.MemoryCopy(), inst.MemoryCopy()); d != 0 {
				t.Fatalf("the parts joined restore a memory that differs in %d bytes", d)
			}
			rhead, rframes, err := fresh.SnapshotParts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			restored := check("restored", rhead, rframes)
			if len(restored) != len(now) {
				t.Fatalf("restored: %d frames, the snapshot it came from %d", len(restored), len(now))
			}
			for sum := range now {
				if _, ok := restored[sum]; !ok {
					t.Fatalf("restored: a frame's sum is not the snapshot's it came from")
				}
			}
		}
	}
	if kept == 0 {
		t.Fatal("no frame came out of a snapshot as out of the one before")
	}
	for k, f := range given {
		if !bytes.Equal(f.got, f.was) {
			t.Fatalf("frame %d of %d given was written over by a later snapshot", k, len(given))
		}
	}
}
