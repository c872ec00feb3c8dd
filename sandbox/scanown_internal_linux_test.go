package sandbox

import (
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// ownScanFixture maps an image of 64 pieces (some holes) into a
// reservation, reads some of its pages, writes others, and touches memory
// past the image (as a guest that grew its memory does): the mix of page
// kinds writtenPieces tells apart.
func ownScanFixture(t testing.TB) (*reservedMemory, []byte) {
	const size = 64 * pieceSize
	img := make([]byte, size)
	for p := 0; p < size; p += 3 * pieceSize {
		img[p] = byte(p/pieceSize + 1)
	}
	f, err := newImageFile(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	m := reserveMemory(4 << 20)
	if m == nil {
		t.Skip("no reservation")
	}
	t.Cleanup(func() { release(m.mem) })
	m.img, m.imgSize = f, size
	if err := m.mapImage(); err != nil {
		t.Fatal(err)
	}
	mem := m.mem[:256*pieceSize]
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	var sink byte
	for p := 0; p < 64; p += 2 {
		sink += mem[p*pieceSize] // present, the file's
	}
	for _, p := range []int{5, 6, 7, 20, 63} {
		mem[p*pieceSize+9] = 1 // copied on write: own
	}
	sink += mem[100*pieceSize] // past the image, read: the zero page
	for _, p := range []int{64, 65, 130, 255} {
		mem[p*pieceSize] = 2 // past the image, written
	}
	_ = sink
	return m, mem
}

// TestScanOwnMatchesPagemap: the PAGEMAP_SCAN answer of which pieces are
// the instance's own is pagemap's, page for page, with and without the
// write tracking's markers in the range (where both call every page own:
// a protected page reads as swapped, which is why the tracking is
// disarmed before the pieces are asked for).
func TestScanOwnMatchesPagemap(t *testing.T) {
	if pagemap() == nil || pieceSize != unix.Getpagesize() {
		t.Skip("no pagemap")
	}
	m, mem := ownScanFixture(t)
	check := func(when string) {
		t.Helper()
		got, err := scanOwn(mem)
		if scanMissing(err) {
			t.Skipf("no PAGEMAP_SCAN (Linux 6.7) or not these categories: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := readWrittenPieces(pagemap(), mem)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: scan %b, pagemap %b", when, got, want)
		}
		viaOwn := make([]uint64, len(want))
		if err := ownPages(mem, func(off int) { viaOwn[off/pieceSize/64] |= 1 << (off / pieceSize % 64) }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(viaOwn, want) {
			t.Fatalf("%s: ownPages %b, pagemap %b", when, viaOwn, want)
		}
		if when == "mapped" && (want[0]&(1<<5|1<<20|1<<63) != 1<<5|1<<20|1<<63 || want[0]&(1<<2) != 0 || want[2]&(1<<2) == 0) {
			t.Fatalf("%s: pagemap %b, not the pieces written", when, want)
		}
	}
	check("mapped")
	if TrackWritesAnyway(t) {
		_, _, _ = m.scanWrites(mem, true, true) // arms the tracking: every page protected
		mem[7*pieceSize] = 3
		check("tracked")
		m.mu.Lock()
		m.disarmWrites()
		m.mu.Unlock()
	}
}

// BenchmarkOwnPieces: what writtenPieces costs over a Go guest's 64 MiB,
// read from pagemap and scanned.
func BenchmarkOwnPieces(b *testing.B) {
	const size = 64 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	for p := 0; p < 3<<20; p += pieceSize * 3 {
		mem[p] = 1 // 3 MiB in use, a third of its pages own
	}
	b.Run("pagemap", func(b *testing.B) {
		for b.Loop() {
			readWrittenPieces(pagemap(), mem)
		}
	})
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			if _, err := scanOwn(mem); err != nil {
				b.Skip(err)
			}
		}
	})
}
