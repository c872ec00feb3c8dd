package sandbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// FuzzDecodeS2 feeds decodePage frames seeded with real S2 frames
// (FuzzSnapshotBody has no S2 seed): it must never panic, fill its page
// exactly or fail with ErrBadSnapshot, and what it accepts must have the
// CRC-32C of the bytes it produced.
func FuzzDecodeS2(f *testing.F) {
	mem := make([]byte, 4*pieceSize)
	copy(mem[100:], "a piece")
	for i := pieceSize; i < 2*pieceSize; i++ {
		mem[i] = byte(i * 7)
	}
	for _, n := range []int{1, 2, 4} {
		ps := make([]pieceHash, n)
		for k := range ps {
			ps[k].index = uint32(k)
		}
		f.Add(encodeFrame(mem, ps).frame, uint8(n))
	}
	f.Fuzz(func(t *testing.T, frame []byte, n uint8) {
		n = n%16 + 1
		page := make([]byte, int(n)*pieceSize)
		err := decodePage(frame, page)
		if err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("error not ErrBadSnapshot: %v", err)
			}
			return
		}
		if !bytes.HasPrefix(frame, zstdMagic) {
			if binary.LittleEndian.Uint32(frame[len(frame)-4:]) != crc32.Checksum(page, castagnoli) {
				t.Fatal("accepted with a wrong CRC")
			}
		}
	})
}
