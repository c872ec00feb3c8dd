//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Write tracking (docs/DESIGN.md, "sandbox: which pieces a call wrote").
// A snapshot compresses only the pieces of memory written since the
// instance's snapshot before; to know which, it used to hash every piece
// the instance had ever made its own (pagemap), 230 to 380 of them for a
// Go guest, most of a checkpoint's CPU. Where the kernel can say which
// pages were written since a point in time, per range, that hashing is
// left to the pages it names.
//
// It can where userfaultfd offers asynchronous write protection
// (UFFD_FEATURE_WP_ASYNC, Linux 6.7; we wait for 6.10, kernelAtLeast) and /proc/self/pagemap the
// PAGEMAP_SCAN ioctl: a reservation is registered with one userfaultfd
// of the process; a write to a protected page takes a minor fault that
// the kernel resolves by itself (no thread of ours handles it), marking
// the page written; a scan names the pages written since the last scan
// and protects them again, in one pass. UFFD_USER_MODE_ONLY asks for no
// privilege (the kernel's own writes into the range, a read(2) into
// guest memory, are tracked all the same: an asynchronous fault never
// reaches the userfaultfd). Where any of it is missing (an older kernel,
// a seccomp profile refusing userfaultfd, pages of another size), the
// snapshot falls back to pagemap and hashing, as before.
//
// What a scan can say is only as good as the mapping it scans: a range
// mapped over (MAP_FIXED) is no longer registered, and a page zapped
// (MADV_DONTNEED) loses its protection. So a reservation's tracking is
// "armed" only by a scan, and disarmed by everything that maps over or
// resets its memory (mapImageLocked, reset), and by a scan for an
// instance that chose to hash (trackChoice: the scan unregisters it); a
// scan of a reservation not armed arms it and says nothing. The caller
// trusts a scan only as far back as the scan before it: the snapshot's
// own, or the one a restore ends with.

// From the kernel's uapi (linux/userfaultfd.h, linux/fs.h of Linux 6.7);
// Debian's headers are older.
const (
	uffdAPI                  = 0xaa
	uffdUserModeOnly         = 1       // userfaultfd(2) flag
	uffdFeatureWPUnpopulated = 1 << 13 // unpopulated pages count as protected
	uffdFeatureWPAsync       = 1 << 15 // the kernel resolves write faults itself
	uffdioAPI                = 0xc018aa3f
	uffdioRegister           = 0xc020aa00
	uffdioUnregister         = 0x8010aa01
	uffdioRegisterModeWP     = 1 << 1
	pagemapScan              = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)
	pmScanWPMatching         = 1 << 0     // protect the pages reported again
	pmScanCheckWPAsync       = 1 << 1     // fail unless the range is registered so
	pageIsWritten            = 1 << 1
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRange struct{ start, len uint64 }

type uffdioRegisterArg struct {
	rng          uffdioRange
	mode, ioctls uint64
}

type pageRegion struct{ start, end, categories uint64 }

type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages      uint64
	categoryInvMask, categoryMask, categoryAnyofMask, returnMask uint64
}

// scanBuf is one scan's ioctl argument and the regions it returns, on
// the heap (the kernel is given their addresses).
type scanBuf struct {
	arg pmScanArg
	vec [256]pageRegion
}

var scanBufs = sync.Pool{New: func() any { return new(scanBuf) }}

// writeTracker is the process's userfaultfd, or -1 where there is none
// with asynchronous write protection. It stays open: closing it would
// unregister every reservation.
var writeTracker = sync.OnceValue(func() int {
	if os.Getpagesize() != pieceSize || pagemap() == nil || !kernelAtLeast(6, 10) {
		return -1
	}
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if errno != 0 {
		return -1
	}
	api := uffdioAPIArg{api: uffdAPI, features: uffdFeatureWPAsync | uffdFeatureWPUnpopulated}
	if ioctl(int(fd), uffdioAPI, unsafe.Pointer(&api)) != nil {
		unix.Close(int(fd))
		return -1
	}
	return int(fd)
})

// kernelAtLeast reports whether the running kernel's release is at least
// major.minor. The scan came with Linux 6.7; its first releases had fixes
// after them to how it reads the protection of pages swapped out or being
// migrated, so tracking waits for 6.10.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var maj, min int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj > major || maj == major && min >= minor
}

// TracksWrites reports whether snapshots can learn from the kernel which
// pages of an instance's memory were written since the last one (Linux
// 6.10 and later, userfaultfd allowed), rather than hashing every page the
// instance made its own. Each instance then tracks where that pays for it
// ([WriteTracking], track_choice.go). The answers are the same either way.
func TracksWrites() bool {
	_, _, ok := trackingCosts()
	return ok
}

// tracking is the process's userfaultfd where snapshots may use it: the
// kernel can track writes, and no scan failed for want of an ioctl.
func tracking() int {
	fd := writeTracker()
	if fd < 0 || scansFailed.Load() {
		return -1
	}
	return fd
}

// trackingPaysByDefault is whether an instance tracks its writes before
// its own snapshots have been measured (trackChoice): where the process's
// measurement says tracking pays for a typical Go guest, or a test forces
// it.
func trackingPaysByDefault() bool {
	return tracking() >= 0 && (trackAnyway.Load() || trackingCost().pays)
}

// trackingCosts is what a piece written costs here tracked (its fault and
// its protection again) and hashed, as measured once; false where writes
// cannot be tracked.
func trackingCosts() (write, hash time.Duration, ok bool) {
	if tracking() < 0 {
		return 0, 0, false
	}
	c := trackingCost()
	return c.write, c.hash, c.write > 0 && c.hash > 0
}

// trackAnyway makes snapshots track writes where the kernel can, whatever
// it costs: for tests of the tracking itself.
var trackAnyway atomic.Bool

// trackingBreakEven is how many pages' hashing a page written may cost,
// in its write-protect fault and its protection again, for an instance to
// track its writes before its own snapshots have been measured
// (trackingPaysByDefault). A Go guest's call writes about one page in ten
// of those it made its own (which the fallback hashes, every snapshot); 4
// leaves room for guests that write more of theirs, and for a noisy
// measurement.
const trackingBreakEven = 4

// costOfTracking is what tracking was measured to cost here, per page.
type costOfTracking struct {
	write time.Duration // a write-protect fault, and the scan protecting the page again
	hash  time.Duration // hashing the page instead (hashPage)
	pays  bool          // write <= trackingBreakEven * hash
}

// trackingCost measures, once, what a page written costs with tracking
// and what hashing it costs without. Tracking trades one minor fault per
// page written per call, and the scan's work of protecting it again, for
// hashing every page an instance made its own at each snapshot. Where a
// fault is cheap (about a microsecond) that can be a good trade (with
// XXH3 hashing a page in under 0.1 µs, a close one); in some
// virtual machines a fault costs 15 to 20 µs (each one an exit to the
// hypervisor), and a Go guest's checkpoint paid more in faults during its
// call than hashing would have cost. The best of three rounds of 64 pages
// each, about a millisecond where faults are that slow.
var trackingCost = sync.OnceValue(func() costOfTracking {
	fd := writeTracker()
	if fd < 0 {
		return costOfTracking{}
	}
	const pages = 64
	b, err := unix.Mmap(-1, 0, pages*pieceSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return costOfTracking{}
	}
	defer unix.Munmap(b) // unregisters the range too
	for p := range pages {
		b[p*pieceSize] = 1
	}
	r := uffdioRegisterArg{rng: uffdioRange{uint64(uintptr(unsafe.Pointer(&b[0]))), uint64(len(b))}, mode: uffdioRegisterModeWP}
	if ioctl(fd, uffdioRegister, unsafe.Pointer(&r)) != nil {
		return costOfTracking{}
	}
	if _, err := scanWritten(b); err != nil { // protects every page
		return costOfTracking{}
	}
	c := costOfTracking{write: time.Hour, hash: time.Hour}
	var sum uint64
	for range 3 {
		start := time.Now()
		for p := range pages {
			b[p*pieceSize]++
		}
		if _, err := scanWritten(b); err != nil {
			return costOfTracking{}
		}
		c.write = min(c.write, time.Since(start)/pages)
		start = time.Now()
		for p := range pages {
			sum += hashPage(b[p*pieceSize : (p+1)*pieceSize])
		}
		c.hash = min(c.hash, time.Since(start)/pages)
	}
	hashSink.Store(sum)
	c.pays = c.write <= trackingBreakEven*c.hash
	return c
})

// hashSink keeps the measurement's hashing from being optimised away.
var hashSink atomic.Uint64

// WriteTracking reports whether snapshots can track writes
// ([TracksWrites]), and why: the kernel's support, what a page written was
// measured to cost with tracking against hashing it without, and so
// whether a new instance starts tracking (its own snapshots choose from
// then on). For the log of a replica's start.
func WriteTracking() (bool, string) {
	switch {
	case writeTracker() < 0:
		return false, "the kernel offers no asynchronous write protection to this process (Linux 6.10 and later, userfaultfd allowed)"
	case scansFailed.Load():
		return false, "a scan failed for want of an ioctl (PAGEMAP_SCAN)"
	}
	c := trackingCost()
	if c.write == 0 {
		return false, "the measurement failed"
	}
	why := fmt.Sprintf("a page written costs %v tracked, %v hashed (in the cache); each instance tracks its writes where its own snapshots show it pays (its calls write few of the pages it owns)", c.write, c.hash)
	if c.pays {
		why += ", and starts tracking"
	} else {
		why += fmt.Sprintf(", and starts hashing (a page tracked costs more than %d hashed)", trackingBreakEven)
	}
	return TracksWrites(), why
}

// scansFailed is set once a scan failed for want of the ioctl or one of
// its flags: tracking is then given up.
var scansFailed atomic.Bool

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// scanWrites returns a bitmap of the pieces of mem (the instance's
// memory: the start of m's reservation) written since m's last scan that
// protected, and whether it can say: false when m's tracking was not
// armed (the first scan since its memory was mapped or reset, which arms
// it) or cannot be. It protects the pages written again when protect is
// set or it arms, and says whether it did (protected); otherwise it
// leaves them as they are, and the next scan names them again. track is
// the instance's choice (trackChoice): without it, m is unregistered (its
// pages take no more faults) and the scan says nothing. m may be nil. The
// caller holds the memory (enterLive), so that no call of the guest
// writes meanwhile.
func (m *reservedMemory) scanWrites(mem []byte, track, protect bool) (written []uint64, ok, protected bool) {
	if m == nil || len(mem) == 0 {
		return nil, false, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	armed := m.wpArmed
	m.wpArmed = false
	fd := tracking()
	if fd < 0 || len(m.mem) == 0 || &m.mem[0] != &mem[0] || len(mem) > len(m.mem) {
		return nil, false, false
	}
	if !track && !trackAnyway.Load() {
		// Its instance hashes instead: its pages take no faults. A
		// range unregistered reads in pagemap as before it was.
		if m.wpRegistered {
			m.disarmWrites()
		}
		return nil, false, false
	}
	if !m.wpRegistered {
		// The whole reservation, so that memory the guest grows into
		// is registered already.
		r := uffdioRegisterArg{rng: uffdioRange{uint64(uintptr(unsafe.Pointer(&m.mem[0]))), uint64(len(m.mem))}, mode: uffdioRegisterModeWP}
		if ioctl(fd, uffdioRegister, unsafe.Pointer(&r)) != nil {
			return nil, false, false
		}
		m.wpRegistered, armed = true, false
	}
	protect = protect || !armed
	var err error
	if protect {
		written, err = scanWritten(mem)
	} else {
		written, err = scanLeavingWritten(mem)
	}
	if err != nil {
		// Left unarmed: the next scan arms it again. An ioctl the
		// kernel does not have gives tracking up for good.
		if scanMissing(err) {
			scansFailed.Store(true)
		}
		return nil, false, false
	}
	m.wpArmed = true
	return written, armed, protect
}

// registeredForWrites reports whether m is registered with the tracker.
// m may be nil.
func (m *reservedMemory) registeredForWrites() bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wpRegistered
}

// disarmWrites unregisters m from the tracker, which removes the
// protection from its pages (so that pagemap tells its own pages from
// the image's again: a protected page never written reads as swapped);
// false if that failed. The caller holds m.mu.
func (m *reservedMemory) disarmWrites() bool {
	m.wpArmed = false
	if !m.wpRegistered {
		return true
	}
	r := uffdioRange{uint64(uintptr(unsafe.Pointer(&m.mem[0]))), uint64(len(m.mem))}
	if ioctl(writeTracker(), uffdioUnregister, unsafe.Pointer(&r)) != nil {
		return false
	}
	m.wpRegistered = false
	return true
}

// scanWritten is one PAGEMAP_SCAN of mem, in as many ioctls as its
// written regions need.
func scanWritten(mem []byte) ([]uint64, error) {
	return scanPieces(mem, pmScanArg{
		flags:        pmScanWPMatching | pmScanCheckWPAsync,
		categoryMask: pageIsWritten, returnMask: pageIsWritten,
	}, nil)
}

// scanLeavingWritten is scanWritten without protecting the pages found
// written again: it names the pages written since the last scan that
// did, and costs the kernel a walk of the page tables but no TLB
// shootdown.
func scanLeavingWritten(mem []byte) ([]uint64, error) {
	return scanPieces(mem, pmScanArg{
		flags:        pmScanCheckWPAsync,
		categoryMask: pageIsWritten, returnMask: pageIsWritten,
	}, nil)
}

// scanPieces runs the PAGEMAP_SCAN q (its flags and masks; the range and
// the vector are filled in) over mem, in as many ioctls as the regions
// need, and returns a bitmap of the pieces of the regions named whose
// categories skip (nil: none) does not reject.
func scanPieces(mem []byte, q pmScanArg, skip func(categories uint64) bool) ([]uint64, error) {
	n := len(mem) / pieceSize
	bits := make([]uint64, (n+63)/64)
	b := scanBufs.Get().(*scanBuf)
	defer scanBufs.Put(b)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	end := base + uint64(n)*pieceSize
	for at := base; at < end; {
		b.arg = q
		b.arg.size = uint64(unsafe.Sizeof(b.arg))
		b.arg.start, b.arg.end = at, end
		b.arg.vec, b.arg.vecLen = uint64(uintptr(unsafe.Pointer(&b.vec[0]))), uint64(len(b.vec))
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, pagemap().Fd(), pagemapScan, uintptr(unsafe.Pointer(&b.arg)))
		if errno != 0 {
			return nil, errno
		}
		if int(r) > len(b.vec) || b.arg.walkEnd <= at || b.arg.walkEnd > end {
			return nil, errors.New("PAGEMAP_SCAN: an answer out of range")
		}
		for _, v := range b.vec[:r] {
			if v.start < at || v.end > b.arg.walkEnd || v.start > v.end {
				return nil, errors.New("PAGEMAP_SCAN: a region out of range")
			}
			if skip != nil && skip(v.categories) {
				continue
			}
			for p := (v.start - base) / pieceSize; p < (v.end-base+pieceSize-1)/pieceSize; p++ {
				bits[p/64] |= 1 << (p % 64)
			}
		}
		at = b.arg.walkEnd
	}
	return bits, nil
}
