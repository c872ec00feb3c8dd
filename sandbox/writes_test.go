package sandbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// needTracking skips where snapshots cannot learn from the kernel which
// pages were written, and has them learn it for the rest of t where they
// can, even where tracking was measured not to pay (sandbox.WriteTracking).
func needTracking(t *testing.T) {
	t.Helper()
	if !sandbox.TrackWritesAnyway(t) {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
}

// TestSnapshotTracksEveryWrite checks the write tracking snapshots rely
// on where the kernel offers it (writes_linux.go): a snapshot reads only
// the pieces written since the one before, so a write it missed would
// restore as the bytes before it. Between snapshots come random writes of
// every kind that reaches an instance's memory: the guest's own stores,
// the host's (Go code writing into the memory, as host functions do), the
// kernel's (a pread(2) into the memory, as WASI's fd_read does, across
// pieces), writes into memory just grown, and writes of the byte already
// there. After each snapshot, the snapshot restored beside the instance
// must hold its memory byte for byte. Now and then the instance is
// replaced by its restored copy (whose tracking the restore arms) or by a
// new instance on a recycled reservation (whose tracking must start
// afresh); and a Go guest's calls are checked the same way.
func TestSnapshotTracksEveryWrite(t *testing.T) {
	needTracking(t)
	checkEveryWrite(t, false)
}

// TestSnapshotSwitchesTracking is TestSnapshotTracksEveryWrite with each
// instance's choice between tracking its writes and hashing its pieces
// (track_choice.go) made at random before each snapshot, so that an
// instance's memory is registered for tracking, armed, used and dropped
// again (after which pagemap must tell its pieces as before) in every
// order, with writes of every kind between.
func TestSnapshotSwitchesTracking(t *testing.T) {
	if !sandbox.TracksWrites() {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
	checkEveryWrite(t, true)
}

// checkEveryWrite is TestSnapshotTracksEveryWrite, with the tracking
// chosen at random before each snapshot when switching.
func checkEveryWrite(t *testing.T, switching bool) {
	ctx := context.Background()
	rt := newRuntime(t)
	noise := make([]byte, 1<<16)
	seed := uint64(os.Getpid())
	rng := rand.New(rand.NewPCG(seed, 27))
	for k := range noise {
		noise[k] = byte(rng.Uint32())
	}
	file := filepath.Join(t.TempDir(), "noise")
	if err := os.WriteFile(file, noise, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	c, err := rt.Compile(ctx, pokeModule(), sandbox.NewPolicy().WithMemoryLimit(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	servlet := compile(t, rt, testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, servlet) // its state becomes the image

	type world struct {
		name string
		c    *sandbox.Compiled
		step func(inst *sandbox.Instance) string
	}
	poke := func(inst *sandbox.Instance) string {
		var did string
		for range 1 + rng.IntN(6) {
			switch op := rng.IntN(6); op {
			case 0:
				fn := []string{"set1", "clear1", "set2"}[rng.IntN(3)]
				if _, err := inst.Call(ctx, fn, nil, nil); err != nil {
					t.Fatalf("%s: %v", fn, err)
				}
				did += " guest:" + fn
			case 1:
				inst.WriteMemory(func(mem []byte) {
					at := rng.IntN(len(mem))
					mem[at] ^= byte(1 + rng.IntN(255))
					did += fmt.Sprintf(" host@%d", at)
				})
			case 2:
				inst.WriteMemory(func(mem []byte) {
					n := 1 + rng.IntN(3*4096)
					at := rng.IntN(len(mem) - n)
					if _, err := f.ReadAt(mem[at:at+n], int64(rng.IntN(len(noise)-n))); err != nil {
						t.Fatal(err)
					}
					did += fmt.Sprintf(" pread@%d+%d", at, n)
				})
			case 3:
				if inst.GrowMemory(uint32(1 + rng.IntN(2))) {
					inst.WriteMemory(func(mem []byte) {
						at := len(mem) - 1 - rng.IntN(1<<16)
						mem[at] = byte(1 + rng.IntN(255))
						did += fmt.Sprintf(" grown+host@%d", at)
					})
				}
			case 4:
				inst.WriteMemory(func(mem []byte) {
					at := rng.IntN(len(mem))
					copy(mem[at:at+1], mem[at:at+1]) // written, unchanged
					did += fmt.Sprintf(" same@%d", at)
				})
			case 5:
				did += " nothing"
			}
		}
		return did
	}
	remember := func(inst *sandbox.Instance) string {
		text := fmt.Sprintf("note %d %0*d", rng.Uint32(), rng.IntN(3000), 0)
		if _, err := callServlet(t, inst, "remember", `{"text":"`+text+`"}`); err != nil {
			t.Fatal(err)
		}
		return " remember"
	}
	for _, w := range []world{{"raw module", c, poke}, {"Go guest", servlet, remember}} {
		t.Run(w.name, func(t *testing.T) {
			inst, err := w.c.Instantiate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { inst.Close(ctx) }()
			tracked, left := 0, 0
			const rounds = 120
			for round := range rounds {
				did := w.step(inst)
				if switching {
					on, protect := rng.IntN(3) != 0, rng.IntN(2) == 0
					inst.ChooseTracking(on)
					inst.ChooseProtecting(protect)
					did += fmt.Sprintf(" tracking:%v protect:%v", on, protect)
				}
				snap, err := inst.Snapshot(ctx)
				if err != nil {
					t.Fatalf("round %d: snapshot: %v", round, err)
				}
				if inst.SnapshotTracked() {
					tracked++
				}
				if inst.SnapshotLeftWritten() {
					left++
					did += " (left written)"
				}
				fresh, err := w.c.Restore(ctx, snap)
				if err != nil {
					t.Fatalf("round %d: restore: %v", round, err)
				}
				if d := sandbox.DifferingBytes(fresh.MemoryCopy(), inst.MemoryCopy()); d != 0 {
					t.Fatalf("round %d (seed %d, after%s): the restored memory differs in %d bytes: a write the snapshot missed", round, seed, did, d)
				}
				switch round % 10 {
				case 6: // go on with the restored copy
					inst.Close(ctx)
					inst = fresh
					continue
				case 9: // go on with a new instance, maybe on a recycled reservation
					inst.Close(ctx)
					if inst, err = w.c.Instantiate(ctx); err != nil {
						t.Fatal(err)
					}
				}
				fresh.Close(ctx)
			}
			switch {
			case switching && (tracked == 0 || tracked > rounds*3/4):
				t.Errorf("%d of %d snapshots knew what was written from the kernel, want some, as they chose at random", tracked, rounds)
			case switching:
			// The first snapshot of each new instance is not tracked: 13
			// of 120.
			case tracked < rounds*3/4:
				t.Errorf("%d of %d snapshots knew what was written from the kernel, want most", tracked, rounds)
			}
			if tracked > 0 && left == 0 {
				// Left written by the rule's choice (after its first
				// two scans of an instance), or at random.
				t.Errorf("none of %d tracked snapshots left the pages written unprotected", tracked)
			}
			t.Logf("%d of %d snapshots tracked, %d of them leaving the pages written unprotected", tracked, rounds, left)
		})
	}
}

// TestSnapshotReprotectsByRule: a long-lived Go guest's snapshots, where
// the rule (not a test's choice) decides when a scan protects the pages
// it finds written again: runs of scans that leave them written, each
// ended by one that protects, and every snapshot restores to the
// instance's memory byte for byte.
func TestSnapshotReprotectsByRule(t *testing.T) {
	if !sandbox.TrackWritesAnyway(t) {
		t.Skip("this system does not track writes")
	}
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, c) // its state becomes the image
	inst := instantiate(t, c)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 47))
	left, reprotected, wasLeft := 0, 0, false
	const rounds = 150
	for round := range rounds {
		text := fmt.Sprintf("note %d %0*d", rng.Uint32(), rng.IntN(2000), 0)
		if _, err := callServlet(t, inst, "remember", `{"text":"`+text+`"}`); err != nil {
			t.Fatal(err)
		}
		snap, err := inst.Snapshot(ctx)
		if err != nil {
			t.Fatalf("round %d: snapshot: %v", round, err)
		}
		isLeft := inst.SnapshotLeftWritten()
		if isLeft {
			left++
		} else if wasLeft && inst.SnapshotTracked() {
			reprotected++
		}
		wasLeft = isLeft
		fresh, err := c.Restore(ctx, snap)
		if err != nil {
			t.Fatalf("round %d: restore: %v", round, err)
		}
		if d := sandbox.DifferingBytes(fresh.MemoryCopy(), inst.MemoryCopy()); d != 0 {
			t.Fatalf("round %d (left written %v): the restored memory differs in %d bytes: a write the snapshot missed", round, isLeft, d)
		}
		fresh.Close(ctx)
	}
	t.Logf("%d of %d snapshots left the pages written; %d runs of them ended by a scan that protected", left, rounds, reprotected)
	if left == 0 || reprotected == 0 {
		t.Errorf("%d snapshots left the pages written, %d runs ended by the rule: want both", left, reprotected)
	}
}
