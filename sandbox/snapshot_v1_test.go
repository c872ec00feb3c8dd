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
// the pages raw (what the host took before version 2), or version 2, a
// frame of each page (before version 3).
func encodeOld(c *Compiled, s *snapshotState, version byte, mem func(p uint32) []byte) []byte {
	var pages []uint32
	for _, p := range s.data {
		if i := p.index / piecesPerPage; len(pages) == 0 || pages[len(pages)-1] != i {
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
	body = binary.AppendUvarint(body, uint64(len(pages)))
	out := append([]byte(snapshotMagic), version)
	out = append(out, c.sha256[:]...)
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
	for _, v := range []byte{snapshotVersion1, snapshotVersion2} {
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
		if string(again) != string(snap) || fresh.snapCompressed != inst.snapCompressed {
			t.Errorf("snapshot after a version %d restore: same bytes %v, %d pieces compressed, want %d", v, string(again) == string(snap), fresh.snapCompressed, inst.snapCompressed)
		}
	}
}
