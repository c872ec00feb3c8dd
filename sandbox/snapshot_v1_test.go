package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"maps"
	"slices"
	"testing"
)

// encodeV1 encodes s as a version 1 snapshot of c: one frame of the
// body, the pages raw (what the host took before version 2).
func encodeV1(c *Compiled, s *snapshotState, mem func(p uint32) []byte) []byte {
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
	body = binary.AppendUvarint(body, uint64(len(s.data)))
	for _, p := range s.data {
		body = append(binary.AppendUvarint(body, uint64(p.index)), mem(p.index)...)
	}
	out := append([]byte(snapshotMagic), snapshotVersion1)
	out = append(out, c.sha256[:]...)
	return encoder().EncodeAll(body, out)
}

// TestRestoreVersion1 restores a snapshot of the previous format: the
// instance has the memory and state of the one it was taken of, and its
// first snapshot, having no frames to reuse, compresses every page.
func TestRestoreVersion1(t *testing.T) {
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
	v1 := encodeV1(c, s, func(p uint32) []byte { return mem[p*pageSize : (p+1)*pageSize] })
	fresh, err := c.Restore(ctx, v1)
	if err != nil {
		t.Fatalf("restore version 1: %v", err)
	}
	defer fresh.Close(ctx)
	err = fresh.withMemory(func(b []byte) error {
		if string(b) != string(mem) {
			t.Error("the memory restored from version 1 differs")
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
	if string(again) != string(snap) || fresh.snapCompressed != 2 {
		t.Errorf("snapshot after a version 1 restore: same bytes %v, %d pages compressed, want 2", string(again) == string(snap), fresh.snapCompressed)
	}
}
