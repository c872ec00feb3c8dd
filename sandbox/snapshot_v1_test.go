package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"testing"
)

// encodeOld encodes s as a snapshot of c in an older format, with each
// 64 KiB page that holds a saved piece: version 1, one frame of the body,
// the pages raw (what the host took before version 2), version 2, a frame
// of each page (before version 3), or with each saved piece: version 3, a
// frame of each piece (before version 4), or version 4, zstd frames of up
// to 16 pieces (before version 5's S2 blocks).
func encodeOld(c *Compiled, s *snapshotState, version byte, mem func(p uint32) []byte) []byte {
	var pieces, pages []uint32
	for _, f := range s.frames {
		pieces = append(pieces, f.pieces...)
	}
	slices.Sort(pieces)
	for _, p := range pieces {
		if i := p / piecesPerPage; len(pages) == 0 || pages[len(pages)-1] != i {
			pages = append(pages, i)
		}
	}
	body := binary.AppendUvarint(nil, uint64(len(s.globals)))
	for _, g := range s.globals {
		body = binary.LittleEndian.AppendUint64(body, g)
	}
	body = binary.LittleEndian.AppendUint64(body, uint64(s.wall))
	body = binary.LittleEndian.AppendUint64(body, uint64(s.mono))
	body = binary.AppendUvarint(body, uint64(len(s.vars)))
	for _, k := range slices.Sorted(maps.Keys(s.vars)) {
		body = appendBytes(appendBytes(body, []byte(k)), s.vars[k])
	}
	body = binary.AppendUvarint(body, uint64(s.pages))
	out := append([]byte(snapshotMagic), version)
	out = append(out, c.sha256[:]...)
	if version == snapshotVersion4 {
		var frames []byte
		var groups [][]uint32
		for _, p := range pieces {
			if n := len(groups); n == 0 || len(groups[n-1]) == framePieces {
				groups = append(groups, nil)
			}
			groups[len(groups)-1] = append(groups[len(groups)-1], p)
		}
		body = binary.AppendUvarint(body, uint64(len(groups)))
		for _, g := range groups {
			var raw []byte
			body = binary.AppendUvarint(body, uint64(len(g)))
			for k, p := range g {
				raw = append(raw, mem(p / piecesPerPage)[p%piecesPerPage*pieceSize:][:pieceSize]...)
				if k == 0 {
					body = binary.AppendUvarint(body, uint64(p))
				} else {
					body = binary.AppendUvarint(body, uint64(p-g[k-1]))
				}
			}
			f := encoder().EncodeAll(raw, nil)
			body = binary.AppendUvarint(body, uint64(len(f)))
			frames = append(frames, f...)
		}
		return append(appendBytes(out, encoder().EncodeAll(body, nil)), frames...)
	}
	if version == snapshotVersion3 {
		body = binary.AppendUvarint(body, uint64(len(pieces)))
		var frames []byte
		for _, p := range pieces {
			f := encoder().EncodeAll(mem(p / piecesPerPage)[p%piecesPerPage*pieceSize:][:pieceSize], nil)
			body = binary.AppendUvarint(binary.AppendUvarint(body, uint64(p)), uint64(len(f)))
			frames = append(frames, f...)
		}
		return append(appendBytes(out, encoder().EncodeAll(body, nil)), frames...)
	}
	body = binary.AppendUvarint(body, uint64(len(pages)))
	if version == snapshotVersion1 {
		for _, p := range pages {
			body = append(binary.AppendUvarint(body, uint64(p)), mem(p)...)
		}
		return encoder().EncodeAll(body, out)
	}
	var frames []byte
	for _, p := range pages {
		f := encoder().EncodeAll(mem(p), nil)
		body = binary.AppendUvarint(binary.AppendUvarint(body, uint64(p)), uint64(len(f)))
		frames = append(frames, f...)
	}
	return append(appendBytes(out, encoder().EncodeAll(body, nil)), frames...)
}

// TestRestoreOlderVersions restores snapshots of the previous formats:
// the instance has the memory and state of the one it was taken of, and
// its first snapshot, having no frames to reuse, compresses every piece.
func TestRestoreOlderVersions(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	c, err := rt.Compile(ctx, []byte("\x00asm\x01\x00\x00\x00\x05\x03\x01\x00\x03"), NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	var mem []byte
	err = inst.withMemory(func(b []byte) error {
		copy(b[pageSize+10:], "page one")
		rand.Read(b[2*pageSize : 2*pageSize+pageSize/2]) // incompressible
		mem = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := inst.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.decodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []byte{snapshotVersion1, snapshotVersion2, snapshotVersion3, snapshotVersion4} {
		old := encodeOld(c, s, v, func(p uint32) []byte { return mem[p*pageSize : (p+1)*pageSize] })
		fresh, err := c.Restore(ctx, old)
		if err != nil {
			t.Fatalf("restore version %d: %v", v, err)
		}
		defer fresh.Close(ctx)
		err = fresh.withMemory(func(b []byte) error {
			if string(b) != string(mem) {
				t.Errorf("the memory restored from version %d differs", v)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		again, err := fresh.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v >= snapshotVersion3 {
			// Its frames are reused (a piece each, or zstd frames of
			// version 4 among version 5's): nothing is compressed, and
			// the snapshot restores the same memory.
			if fresh.snapCompressed != 0 {
				t.Errorf("snapshot after a version %d restore compressed %d pieces, want 0", v, fresh.snapCompressed)
			}
			third, err := c.Restore(ctx, again)
			if err != nil {
				t.Fatal(err)
			}
			defer third.Close(ctx)
			_ = third.withMemory(func(b []byte) error {
				if string(b) != string(mem) {
					t.Errorf("the memory restored from the snapshot after a version %d restore differs", v)
				}
				return nil
			})
			if v == snapshotVersion4 {
				checkMixedFrames(t, c, fresh)
			}
			continue
		}
		if string(again) != string(snap) || fresh.snapCompressed != inst.snapCompressed {
			t.Errorf("snapshot after a version %d restore: same bytes %v, %d pieces compressed, want %d", v, string(again) == string(snap), fresh.snapCompressed, inst.snapCompressed)
		}
	}
}

// checkMixedFrames changes one piece of inst, restored from a version 4
// snapshot, whose other frames are zstd's: its next snapshot holds both
// zstd frames and S2 blocks, and restores the memory it was taken of.
func checkMixedFrames(t *testing.T, c *Compiled, inst *Instance) {
	t.Helper()
	ctx := context.Background()
	var want []byte
	_ = inst.withMemory(func(b []byte) error {
		copy(b[pageSize+pieceSize+7:], "changed after the restore")
		want = slices.Clone(b)
		return nil
	})
	snap, err := inst.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	zstdFrames, s2Frames := 0, 0
	for _, f := range inst.snapFrames {
		if bytes.HasPrefix(f.frame, zstdMagic) {
			zstdFrames++
		} else {
			s2Frames++
		}
	}
	if zstdFrames == 0 || s2Frames == 0 {
		t.Errorf("%d zstd frames and %d S2 blocks after a change, want both", zstdFrames, s2Frames)
	}
	again, err := c.Restore(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(ctx)
	_ = again.withMemory(func(b []byte) error {
		if !bytes.Equal(b, want) {
			t.Error("the memory restored from a snapshot of zstd frames and S2 blocks differs")
		}
		return nil
	})
}

// TestS2FrameChecked: an S2 block whose bytes were changed, or whose
// checksum is not its bytes', is refused.
func TestS2FrameChecked(t *testing.T) {
	mem := make([]byte, 2*pieceSize)
	rand.Read(mem[:100])
	copy(mem[pieceSize:], "some text, some text, some text")
	f := encodeFrame(mem, []pieceHash{{index: 0}, {index: 1}})
	page := make([]byte, 2*pieceSize)
	if err := decodePage(f.frame, page); err != nil || !bytes.Equal(page, mem) {
		t.Fatalf("decode: %v", err)
	}
	for name, bad := range map[string][]byte{
		"byte changed": func() []byte { b := slices.Clone(f.frame); b[len(b)/2] ^= 1; return b }(),
		"sum changed":  func() []byte { b := slices.Clone(f.frame); b[len(b)-1] ^= 1; return b }(),
		"cut":          f.frame[:len(f.frame)-5],
		"short":        f.frame[:3],
	} {
		if err := decodePage(bad, page); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := decodePage(f.frame, make([]byte, pieceSize)); !errors.Is(err, ErrBadSnapshot) {
		t.Errorf("a block of two pieces into one: %v", err)
	}
	// Incompressible pieces take no more than maxFrameOver over their size.
	mem = make([]byte, framePieces*pieceSize)
	rand.Read(mem)
	all := make([]pieceHash, framePieces)
	for k := range all {
		all[k].index = uint32(k)
	}
	if f := encodeFrame(mem, all); len(f.frame) > len(mem)+maxFrameOver {
		t.Errorf("an incompressible frame of %d bytes takes %d", len(mem), len(f.frame))
	}
}
