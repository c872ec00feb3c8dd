package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"maps"
	"slices"
	"testing"
)

// encodeOld encodes s as a snapshot of c in an older format, with each
// 64 KiB page that holds a saved piece: version 1, one frame of the body,
// the pages raw (what the host took before version 2), version 2, a frame
// of each page (before version 3), or with each saved piece: version 3, a
// frame of each piece (before version 4).
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
	for _, v := range []byte{snapshotVersion1, snapshotVersion2, snapshotVersion3} {
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
		if v == snapshotVersion3 {
			// Its frames are reused, a piece each: nothing is compressed,
			// and the snapshot restores the same memory.
			if fresh.snapCompressed != 0 {
				t.Errorf("snapshot after a version 3 restore compressed %d pieces, want 0", fresh.snapCompressed)
			}
			third, err := c.Restore(ctx, again)
			if err != nil {
				t.Fatal(err)
			}
			defer third.Close(ctx)
			_ = third.withMemory(func(b []byte) error {
				if string(b) != string(mem) {
					t.Error("the memory restored from the snapshot after a version 3 restore differs")
				}
				return nil
			})
			continue
		}
		if string(again) != string(snap) || fresh.snapCompressed != inst.snapCompressed {
			t.Errorf("snapshot after a version %d restore: same bytes %v, %d pieces compressed, want %d", v, string(again) == string(snap), fresh.snapCompressed, inst.snapCompressed)
		}
	}
}
