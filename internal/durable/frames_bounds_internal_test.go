package durable

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A split record of n empty frames of its own (a zero tag: 1 byte a
// frame) is refused before it costs much: a valid record never holds an
// empty frame, nor more frames than maxBaseFrames. (It was read, at a
// 32-byte frameRef a byte: a record of MaxValue, 64 MiB, asked for some 4
// GiB. Measured here with 2 Mi frames.)
func TestSplitRecordFrameCountBounded(t *testing.T) {
	const n = 2 << 20
	b := []byte(recordMagic)
	b = append(b, splitVersion)
	b = appendBytes(b, []byte(`{"host":true,"sha256":"ab"}`))
	b = appendBytes(b, []byte("head"))
	b = append(b, make([]byte, baseSumSize)...)
	b = binary.AppendUvarint(b, n)
	b = append(b, make([]byte, n)...)
	var err error
	used := allocated(func() {
		var pr pluginRecord
		err = unmarshalRecord(b, &pr)
		if err == nil {
			_, err = readPlugin(map[string][]byte{"p/x": b}, "x")
		}
	})
	t.Logf("a record of %d bytes: %d bytes allocated reading it (err %v)", len(b), used, err)
	if err == nil && used > 8*uint64(len(b)) {
		t.Fatalf("a %d-byte record of %d empty frames accepted, %d bytes allocated (%.0fx)", len(b), n, used, float64(used)/float64(len(b)))
	}
}

// The same for a base: no empty frame, at most maxBaseFrames (learnBase,
// from seed and Stored, built a map entry a frame).
func TestBaseFrameCountBounded(t *testing.T) {
	const n = 2 << 20
	field := []byte(baseMagic)
	field = append(field, baseVersion)
	field = binary.AppendUvarint(field, n)
	field = append(field, bytes.Repeat([]byte{0}, n)...)
	c := newClaim(sessions.Client("x"), "id")
	var fs [][]byte
	var err error
	used := allocated(func() {
		fs, err = unmarshalBase(field)
		c.learnBase("x", map[string][]byte{"b/x": field})
	})
	t.Logf("a base of %d bytes: %d frames, %d bytes allocated (err %v)", len(field), len(fs), used, err)
	if err == nil && used > 8*uint64(len(field)) {
		t.Fatalf("a %d-byte base of %d empty frames accepted, %d bytes allocated (%.0fx)", len(field), n, used, float64(used)/float64(len(field)))
	}
}
