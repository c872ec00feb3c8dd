package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"testing"
)

// TestFramesSort sorts pieces against a last snapshot's frames: a frame
// is kept only if none of its pieces changed or went back to the initial
// image; the changed pieces and the unchanged ones of broken frames come
// back apart, in order.
func TestFramesSort(t *testing.T) {
	last := cachedFrames{
		{pieces: []uint32{1, 2, 3}, hashes: []uint64{10, 20, 30}},
		{pieces: []uint32{5, 6}, hashes: []uint64{50, 60}},
		{pieces: []uint32{9}, hashes: []uint64{90}},
	}
	type want struct {
		keep         []uint32 // first piece of each kept frame
		fresh, stale []pieceHash
	}
	for _, tc := range []struct {
		name string
		now  map[uint32]uint64 // hashes now; absent: unwritten, 0: initial
		want want
	}{
		{"nothing written", map[uint32]uint64{}, want{keep: []uint32{1, 5, 9}}},
		{"rewritten the same", map[uint32]uint64{1: 10, 2: 20, 3: 30, 5: 50, 6: 60, 9: 90}, want{keep: []uint32{1, 5, 9}}},
		{"one changed, one back to the image, one new",
			map[uint32]uint64{2: 21, 6: 0, 8: 80},
			want{keep: []uint32{9}, fresh: []pieceHash{{2, 21}, {8, 80}}, stale: []pieceHash{{1, 10}, {3, 30}, {5, 50}}}},
		{"a new piece only", map[uint32]uint64{0: 1}, want{keep: []uint32{1, 5, 9}, fresh: []pieceHash{{0, 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keep, fresh, stale := last.sort(10, nil, 0, nil, func(p uint32) (look, uint64) {
				switch h, ok := tc.now[p]; {
				case !ok:
					return unwritten, 0
				case h == 0:
					return initial, 0
				default:
					return hashed, h
				}
			})
			var firsts []uint32
			for _, f := range keep {
				firsts = append(firsts, f.pieces[0])
			}
			if !slices.Equal(firsts, tc.want.keep) || !slices.Equal(fresh, tc.want.fresh) || !slices.Equal(stale, tc.want.stale) {
				t.Errorf("kept %v, fresh %v, stale %v; want %v, %v, %v", firsts, fresh, stale, tc.want.keep, tc.want.fresh, tc.want.stale)
			}
		})
	}
}

// TestFramesSortSkipsUnwritten: pieces whose bit in the written bitmap
// is clear (below the bound the bitmap covers) are taken as unwritten
// without asking see, and the answer is the same as asking see of every
// piece; scratch reused across calls changes nothing.
func TestFramesSortSkipsUnwritten(t *testing.T) {
	var scratch sortScratch
	r := mrand.New(mrand.NewPCG(1, 2))
	for round := range 500 {
		pieces := uint32(1 + r.IntN(400))
		var last cachedFrames
		for p := uint32(0); p < pieces; {
			n := uint32(1 + r.IntN(5))
			var f cachedFrame
			for k := uint32(0); k < n && p+k < pieces; k++ {
				if r.IntN(3) > 0 {
					f.pieces = append(f.pieces, p+k)
					f.hashes = append(f.hashes, uint64(p+k)*7+1)
				}
			}
			if len(f.pieces) > 0 {
				last = append(last, f)
			}
			p += n + uint32(r.IntN(70))
		}
		written := make([]uint64, (pieces+63)/64)
		for p := range pieces {
			if r.IntN(10) == 0 {
				written[p/64] |= 1 << (p % 64)
			}
		}
		below := uint32(r.IntN(int(pieces) + 1))
		now := func(p uint32) (look, uint64) {
			switch r := (p * 2654435761) % 5; {
			case r == 0:
				return initial, 0
			case r == 1:
				return hashed, uint64(p)*7 + 1 // as in the last snapshot
			default:
				return hashed, uint64(p)*7 + uint64(round) + 2
			}
		}
		asked := 0
		keep, fresh, stale := last.sort(pieces, written, below, &scratch, func(p uint32) (look, uint64) {
			asked++
			if p < below && written[p/64]&(1<<(p%64)) == 0 {
				t.Fatalf("round %d: asked of piece %d, unwritten below %d", round, p, below)
			}
			return now(p)
		})
		wkeep, wfresh, wstale := last.sort(pieces, nil, 0, nil, func(p uint32) (look, uint64) {
			if p < below && written[p/64]&(1<<(p%64)) == 0 {
				return unwritten, 0
			}
			return now(p)
		})
		firsts := func(fs []cachedFrame) (out []uint32) {
			for _, f := range fs {
				out = append(out, f.pieces[0])
			}
			return out
		}
		if !slices.Equal(firsts(keep), firsts(wkeep)) || !slices.Equal(fresh, wfresh) || !slices.Equal(stale, wstale) {
			t.Fatalf("round %d (%d pieces, below %d): kept %v, fresh %v, stale %v; want %v, %v, %v", round, pieces, below,
				firsts(keep), fresh, stale, firsts(wkeep), wfresh, wstale)
		}
		if want := int(pieces - below); asked < want {
			t.Fatalf("round %d: asked of %d pieces, fewer than the %d at or past the bound", round, asked, want)
		}
	}
}

// TestParseFramesRefuses refuses version 4 frame lists that are not
// whole, ordered pieces of the memory, each once.
func TestParseFramesRefuses(t *testing.T) {
	head := binary.AppendUvarint(nil, 0)             // no globals
	head = binary.LittleEndian.AppendUint64(head, 0) // wall
	head = binary.LittleEndian.AppendUint64(head, 0) // mono
	head = binary.AppendUvarint(head, 0)             // no vars
	head = binary.AppendUvarint(head, 1)             // one 64 KiB page: 16 pieces
	frame := encoder().EncodeAll(make([]byte, 2*pieceSize), nil)
	// body: the frames, each (count, first, gaps...) with frame's length.
	body := func(frames ...[]uint64) []byte {
		b := binary.AppendUvarint(slices.Clone(head), uint64(len(frames)))
		for _, f := range frames {
			for _, v := range f {
				b = binary.AppendUvarint(b, v)
			}
			b = binary.AppendUvarint(b, uint64(len(frame)))
		}
		return b
	}
	frames := func(n int) []byte { return bytes.Repeat(frame, n) }
	if _, err := parseSnapshotBody(body([]uint64{2, 3, 4}), snapshotVersion, pieceSize, frames(1), 0, 4); err != nil {
		t.Fatalf("a frame of pieces 3 and 7: %v", err)
	}
	for name, list := range map[string][][]uint64{
		"a gap of 0":              {{2, 3, 0}},
		"a gap that wraps around": {{2, 3, 1<<64 - 1}},
		"past the memory":         {{2, 15, 1}},
		"a piece in two frames":   {{2, 3, 1}, {2, 4, 1}},
		"no pieces":               {{0}},
		"more than 16 pieces":     {append([]uint64{17, 0}, slices.Repeat([]uint64{1}, 16)...)},
	} {
		if _, err := parseSnapshotBody(body(list...), snapshotVersion, pieceSize, frames(len(list)), 0, 4); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", name, err)
		}
	}
}

// TestIncompressibleFramesRestore snapshots a memory of random bytes:
// whole frames of 16 incompressible pieces stay within the bound a
// restore allows a frame (its pieces and 64 bytes), and restore exactly.
func TestIncompressibleFramesRestore(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	c, err := rt.Compile(ctx, []byte("\x00asm\x01\x00\x00\x00\x05\x03\x01\x00\x03"), NewPolicy()) // 3 pages of memory
	if err != nil {
		t.Fatal(err)
	}
	inst, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	var mem []byte
	_ = inst.withMemory(func(b []byte) error {
		rand.Read(b)
		mem = slices.Clone(b)
		return nil
	})
	snap, err := inst.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(inst.snapFrames) != 3 || inst.snapCompressed != 3*framePieces {
		t.Errorf("%d frames, %d pieces compressed; want 3 frames of %d", len(inst.snapFrames), inst.snapCompressed, framePieces)
	}
	fresh, err := c.Restore(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close(ctx)
	_ = fresh.withMemory(func(b []byte) error {
		if !bytes.Equal(b, mem) {
			t.Error("the restored memory differs")
		}
		return nil
	})
}

// TestFrameListsTakeTurns: the list of frames a snapshot fills never lies
// in the memory of the list it sorts (the instance's last), whichever of
// the two it came from, nor holds frames of the snapshot before.
func TestFrameListsTakeTurns(t *testing.T) {
	var s sortScratch
	frame := func(p uint32) cachedFrame { return cachedFrame{pieces: []uint32{p}} }
	var last cachedFrames
	for round := range 20 {
		l := s.frameList(last, len(last)+2)
		if holds(l, last) {
			t.Fatalf("round %d: the new list lies in the last's memory", round)
		}
		for k, f := range l[:cap(l)] {
			if f.pieces != nil {
				t.Fatalf("round %d: the new list holds a frame at %d", round, k)
			}
		}
		for p := range uint32(len(last) + 1 + round%3) {
			l = append(l, frame(p))
		}
		last = l
		if round%5 == 4 {
			last = last[1:] // a list that does not start its memory
		}
	}
	if holds(make([]cachedFrame, 4), cachedFrames{frame(1)}) {
		t.Error("holds: two lists' memories overlap")
	}
}

// TestMergeFrames: a snapshot's kept frames, in order, and its new ones,
// in any order, come out as sorting them all would order them, whether
// the new ones go first, last, between or among the kept, and more than
// the merge's buffer holds.
func TestMergeFrames(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(47, 1))
	for round := range 2000 {
		n := rng.IntN(40)
		firsts := rng.Perm(200)[:n]
		var all []cachedFrame
		for _, p := range firsts {
			all = append(all, cachedFrame{pieces: []uint32{uint32(p)}})
		}
		kept := 0
		if n > 0 {
			kept = rng.IntN(n + 1)
			if rng.IntN(4) == 0 {
				kept = max(n-rng.IntN(12), 0) // the usual case: a few new
			}
		}
		slices.SortFunc(all[:kept], byFirstPiece)
		got := slices.Clone(all)
		mergeFrames(got, kept)
		want := slices.Clone(all)
		slices.SortFunc(want, byFirstPiece)
		if !slices.EqualFunc(got, want, func(a, b cachedFrame) bool { return a.pieces[0] == b.pieces[0] }) {
			first := func(fs []cachedFrame) (ps []uint32) {
				for _, f := range fs {
					ps = append(ps, f.pieces[0])
				}
				return ps
			}
			t.Fatalf("round %d: %d kept of %v: merged %v, want %v", round, kept, first(all), first(got), first(want))
		}
	}
}
