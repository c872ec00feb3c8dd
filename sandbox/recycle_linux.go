//go:build linux

package sandbox

import (
	"encoding/binary"
	"errors"
	bits64 "math/bits"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Recycled reservations (docs/DESIGN.md, "sandbox: recycled
// reservations"). A page an instance writes in its copy-on-write mapping
// of the image costs a page fault that allocates and copies it, and on
// the machines we measured a fault costs 15 to 20 µs: a Go guest's first
// call writes some forty pages, most of a millisecond, and then the
// instance's close unmaps them all again. So the reservation of an
// instance started from the image is not unmapped when wazero frees it:
// it is reset to the image and kept for the next instance of the image,
// whose first call then writes pages that are already its own. The
// wazero module is never reused: a new instance gets fresh globals,
// tables and WASI state from wazero as always; only the memory is reused,
// and it holds the image's bytes exactly.
//
// The reset finds the pages the instance made its own (written, so
// copied from the image) in /proc/self/pagemap, which says of each page
// of the mapping whether it is still the image file's, and copies the
// image's bytes back over those; memory grown past the image goes back to
// the system. Where pagemap cannot be read, reservations are unmapped as
// before.
const (
	// maxPooled bounds the reservations an image keeps.
	maxPooled = 8
	// maxKept bounds the private pages one pooled reservation keeps: a
	// reservation that made more of the image its own is mapped afresh
	// (its pages freed), so that a guest that writes all its memory
	// does not leave the pool holding copies of the image.
	maxKept = 1 << 20
	// maxPoolKept bounds the private pages all of an image's pooled
	// reservations keep.
	maxPoolKept = maxPooled * maxKept / 2
)

var pagemap = sync.OnceValue(func() *os.File {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil
	}
	return f
})

// Bits of a pagemap entry (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // a file page or shared anonymous: not the mapping's own
)

// ownPages calls f with the offset of each page of b (which starts on a
// page) that is the process's own: written since it was mapped from a
// file (copied on write), or swapped out. Pages not mapped yet, or mapped
// from the file, are the file's.
func ownPages(b []byte, f func(off int)) error {
	pm := pagemap()
	if pm == nil {
		return os.ErrNotExist
	}
	ps := os.Getpagesize()
	if ps == pieceSize && useOwnScan() {
		if bits, err := scanOwn(b); err == nil {
			for i, w := range bits {
				for ; w != 0; w &= w - 1 {
					f((i*64 + bits64.TrailingZeros64(w)) * ps)
				}
			}
			return nil
		} else if scanMissing(err) {
			ownScanFailed.Store(true)
		}
	}
	n := len(b) / ps
	buf := make([]byte, 8*min(n, 4096))
	base := uintptr(unsafe.Pointer(&b[0])) / uintptr(ps)
	for done := 0; done < n; {
		k := min(n-done, len(buf)/8)
		if _, err := pm.ReadAt(buf[:8*k], int64(base+uintptr(done))*8); err != nil {
			return err
		}
		for i := 0; i < k; i++ {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			if e&pmSwapped != 0 || e&pmPresent != 0 && e&pmFile == 0 {
				f((done + i) * ps)
			}
		}
		done += k
	}
	return nil
}

// writtenPieces returns a bitmap of the pieceSize pieces of mem (an
// instance's memory, which starts on a page) that may have been written
// since they were mapped (a copy on write of the image, anonymous memory
// touched, or swapped): each other piece is still the image file's, or
// never touched. nil when the system cannot say (no pagemap, or pages
// of another size). Snapshots read only the written pieces.
func writtenPieces(mem []byte) []uint64 {
	pm := pagemap()
	if pm == nil || os.Getpagesize() != pieceSize || len(mem) == 0 {
		return nil
	}
	if useOwnScan() {
		bits, err := scanOwn(mem)
		if err == nil {
			return bits
		}
		if scanMissing(err) {
			ownScanFailed.Store(true)
		}
	}
	return readWrittenPieces(pm, mem)
}

// scanMissing reports whether err says the kernel has no PAGEMAP_SCAN
// (Linux 6.7), or not the flags asked for.
func scanMissing(err error) bool {
	return errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)
}

// ownScanFailed is set once scanOwn failed for want of the ioctl
// (PAGEMAP_SCAN, Linux 6.7): writtenPieces reads pagemap from then on.
var ownScanFailed atomic.Bool

// useOwnScan reports whether own pages are found by scanOwn. Like the
// write tracking it waits for Linux 6.10, as the scan's first releases
// had fixes after them; the recycling's reset trusts its answer to leave
// nothing of a session behind.
func useOwnScan() bool { return ownScanKernel() && !ownScanFailed.Load() }

var ownScanKernel = sync.OnceValue(func() bool { return kernelAtLeast(6, 10) })

// Categories of PAGEMAP_SCAN (linux/fs.h), besides pageIsWritten.
const (
	pageIsFile    = 1 << 2
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4
)

// scanOwn is writtenPieces in PAGEMAP_SCAN ioctls rather than reads of
// pagemap: the same test of each page (swapped, or present and not a
// file's page: the kernel's PAGE_IS_FILE is pagemap's PM_FILE), but the
// kernel answers in regions of pages alike, not 8 bytes a page. A Go
// guest's 16,384 pages read 128 KiB of pagemap, about 60 µs of each
// snapshot on a 2-core VM; the scan takes a fraction of that.
func scanOwn(mem []byte) ([]uint64, error) {
	return scanPieces(mem, pmScanArg{
		categoryAnyofMask: pageIsPresent | pageIsSwapped,
		returnMask:        pageIsPresent | pageIsSwapped | pageIsFile,
	}, func(c uint64) bool {
		return c&pageIsSwapped == 0 && c&pageIsFile != 0 // the image file's page
	})
}

// readWrittenPieces is writtenPieces by reading pagemap, 8 bytes a page.
func readWrittenPieces(pm *os.File, mem []byte) []uint64 {
	n := len(mem) / pieceSize
	bits := make([]uint64, (n+63)/64)
	bp := pagemapBuf.Get().(*[]byte)
	defer pagemapBuf.Put(bp)
	buf := *bp
	base := uintptr(unsafe.Pointer(&mem[0])) / pieceSize
	for done := 0; done < n; {
		k := min(n-done, len(buf)/8)
		if _, err := pm.ReadAt(buf[:8*k], int64(base+uintptr(done))*8); err != nil {
			return nil
		}
		for i := 0; i < k; i++ {
			e := binary.LittleEndian.Uint64(buf[8*i:])
			if e&pmSwapped != 0 || e&pmPresent != 0 && e&pmFile == 0 {
				bits[(done+i)/64] |= 1 << ((done + i) % 64)
			}
		}
		done += k
	}
	return bits
}

// pagemapBuf holds buffers of *[]byte for writtenPieces' reads of pagemap,
// 4096 entries at a time.
var pagemapBuf = sync.Pool{New: func() any {
	b := make([]byte, 8*4096)
	return &b
}}

// take returns a pooled reservation of max bytes, reset to the image,
// or nil.
func (f *imageFile) take(max uint64) *reservedMemory {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.pool) > 0 {
		m := f.pool[len(f.pool)-1]
		f.pool = f.pool[:len(f.pool)-1]
		f.poolKept -= m.kept
		if uint64(len(m.mem)) == max {
			m.kept = 0
			return m
		}
		_ = release(m.mem)
	}
	return nil
}

// recycle resets m, a reservation on f that wazero freed, to the image,
// and pools it; it reports false, changing nothing the caller relies on,
// when m is to be unmapped instead. The caller holds m.mu.
func (f *imageFile) recycle(m *reservedMemory) bool {
	f.mu.RLock()
	ok := !f.closed && len(f.pool) < maxPooled && f.poolKept < maxPoolKept
	f.mu.RUnlock()
	if !ok || len(m.mem) == 0 {
		return false
	}
	if _, err := f.imageView(); err != nil {
		return false
	}
	kept, ok := f.reset(m)
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || len(f.pool) >= maxPooled || f.poolKept+kept > maxPoolKept {
		return false
	}
	f.pool = append(f.pool, &reservedMemory{mem: m.mem, committed: m.imgSize, reused: true, kept: kept})
	f.poolKept += kept
	return true
}

// reset makes m's memory the image's again, and reports the bytes of
// the image m keeps as its own pages. It holds f.mu (read), so that the
// view is not unmapped under it.
func (f *imageFile) reset(m *reservedMemory) (kept uint64, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed || f.view == nil || !m.disarmWrites() {
		return 0, false
	}
	size := m.imgSize
	if m.committed > size {
		grown := m.mem[size:m.committed]
		if unix.Madvise(grown, unix.MADV_DONTNEED) != nil || unix.Mprotect(grown, unix.PROT_NONE) != nil {
			return 0, false
		}
		m.committed = size
	}
	if size == 0 {
		return 0, true
	}
	var own []int
	if err := ownPages(m.mem[:size], func(off int) { own = append(own, off) }); err != nil {
		return 0, false
	}
	ps := os.Getpagesize()
	if kept = uint64(len(own) * ps); kept > maxKept {
		// Mapped afresh: the pages it made its own are freed.
		return 0, m.mapImageLocked() == nil
	}
	for _, off := range own {
		copy(m.mem[off:off+ps], f.view[off:off+ps])
	}
	return kept, true
}

// imageView returns the image mapped read-only and shared, mapping it the
// first time.
func (f *imageFile) imageView() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	if f.view == nil {
		v, err := unix.Mmap(f.fd, 0, f.size, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, err
		}
		f.view = v
	}
	return f.view, nil
}

// pooled reports how many reservations f keeps.
func (f *imageFile) pooled() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.pool)
}
