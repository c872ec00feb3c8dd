//go:build linux

package sandbox

import (
	"errors"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// reserveMemory reserves max bytes of address space, inaccessible until
// committed, or returns nil (the instance then uses wazero's allocation).
// MAP_NORESERVE and PROT_NONE keep the reservation out of the kernel's
// commit charge until pages are committed.
func reserveMemory(max uint64) *reservedMemory {
	if max == 0 || max > 1<<32 {
		return nil
	}
	b, err := unix.Mmap(-1, 0, int(max), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil
	}
	return &reservedMemory{mem: b}
}

// commit makes b, pages of a reservation, readable and writable. Fresh
// anonymous pages read as zero, as new Wasm pages must.
func commit(b []byte) error {
	return unix.Mprotect(b, unix.PROT_READ|unix.PROT_WRITE)
}

func release(b []byte) error { return unix.Munmap(b) }

// imageFile is a pre-initialised image's memory in a memfd, which each
// instance maps copy-on-write (MAP_PRIVATE): pages an instance has not
// written are the file's, shared by every instance.
type imageFile struct {
	fd   int
	size int
	// mu is held (read) while the descriptor is mapped, and (write) to
	// close it: a descriptor closed under a mapping might be reused by
	// another file, which the guest would then read.
	mu     sync.RWMutex
	closed bool

	// The pool of reservations freed by instances of the image, reset to
	// it, for new instances (recycle_linux.go); view is the image
	// mapped read-only, from which they are reset. Both under mu.
	pool     []*reservedMemory
	poolKept uint64 // the private bytes the pooled reservations hold
	view     []byte
}

// newImageFile writes mem to a new memfd. Pages of zeros are left as
// holes, which cost nothing until written.
func newImageFile(mem []byte) (*imageFile, error) {
	fd, err := unix.MemfdCreate("wasmtools-image", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := &imageFile{fd: fd, size: len(mem)}
	if err := unix.Ftruncate(fd, int64(len(mem))); err != nil {
		f.close()
		return nil, err
	}
	const chunk = 4096
	for off := 0; off < len(mem); off += chunk {
		b := mem[off:min(off+chunk, len(mem))]
		if isZero(b) {
			continue
		}
		if _, err := unix.Pwrite(fd, b, int64(off)); err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// bytes reads the whole image, for an instance whose memory is not a
// reservation to map it into.
func (f *imageFile) bytes() ([]byte, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil, ErrClosed
	}
	b := make([]byte, f.size)
	if _, err := unix.Pread(f.fd, b, 0); err != nil {
		return nil, err
	}
	return b, nil
}

func (f *imageFile) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		_ = unix.Close(f.fd)
		for _, m := range f.pool {
			_ = release(m.mem)
		}
		f.pool, f.poolKept = nil, 0
		if f.view != nil {
			_ = unix.Munmap(f.view)
			f.view = nil
		}
	}
}

// mapImage maps the image over the start of the reservation,
// copy-on-write, in place of what was there (MAP_FIXED), so that slices
// of the reservation stay valid and now read the image. The caller holds
// m.mu.
func (m *reservedMemory) mapImage() error {
	size := m.imgSize
	if m.mem == nil || size > uint64(len(m.mem)) || size > uint64(m.img.size) || unsafe.Sizeof(uintptr(0)) != 8 {
		return errors.ErrUnsupported
	}
	m.img.mu.RLock()
	defer m.img.mu.RUnlock()
	return m.mapImageLocked()
}

// mapImageLocked is mapImage with m.img.mu held (read).
func (m *reservedMemory) mapImageLocked() error {
	size := m.imgSize
	if m.img.closed {
		return ErrClosed
	}
	if size > 0 {
		_, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(unsafe.Pointer(&m.mem[0])), uintptr(size),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_FIXED, uintptr(m.img.fd), 0)
		if errno != 0 {
			return errno
		}
	}
	// The mapping replaced is no longer registered, nor is what it
	// held tracked.
	m.wpRegistered, m.wpArmed = false, false
	m.onImage = true
	m.committed = max(m.committed, size)
	return nil
}
