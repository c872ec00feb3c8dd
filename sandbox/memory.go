package sandbox

import (
	"errors"
	"fmt"
	"sync"
)

// reservedMemory is one instance's linear memory, reserved whole at its
// maximum when the instance starts and committed as the guest grows it,
// so that memory.grow never reallocates and copies (which left the old
// copies to the garbage collector: growing to 256 MiB page by page peaked
// at 715 MiB of RSS). It implements wazero's experimental.LinearMemory.
//
// The reservation is address space, not memory: pages cost RSS when the
// guest first touches them. It is outside the Go heap, so it is freed
// when wazero frees the memory, never by the garbage collector. On
// systems without mmap (see memory_other.go) the instance uses wazero's
// own allocation instead.
//
// wazero frees the memory when the module is closed, which may happen on
// another goroutine while the guest runs (closing a Compiled closes its
// instances). Unmapping under a running guest would crash the process, so
// the instance marks its calls with enter and exit, and a Free during a
// call is carried out by the call's exit.
type reservedMemory struct {
	mu        sync.Mutex
	mem       []byte // the reservation; nil once unmapped
	committed uint64 // bytes readable and writable, from the start
	busy      bool   // a call of the instance is running
	freed     bool   // wazero freed the memory during a call

	// For an instance starting from a pre-initialised image: img is to
	// be mapped over the first imgSize bytes (onImage once it is), early
	// when it was mapped before wazero applied the data segments, and
	// scratch is where to find a buffer for those segments meanwhile.
	img        *imageFile
	imgSize    uint64
	onImage    bool
	early      bool
	scratch    *sync.Pool
	scratchBuf *[]byte
	// reused: the reservation comes from img's pool of freed ones
	// (recycle.go), its first imgSize bytes holding the image already.
	reused bool
	kept   uint64 // while pooled: the private bytes it holds

	// Write tracking (writes_linux.go): the reservation is registered
	// with the process's userfaultfd, and armed since its last scan.
	wpRegistered bool
	wpArmed      bool

	// started: Reallocate has returned memory once (wazero's first
	// allocation, the memory's minimum, is behind it). startErr: why
	// that first allocation could not be the reservation's; the
	// instance then fails to start (see Reallocate).
	started  bool
	startErr error
}

// Reallocate implements experimental.LinearMemory: it commits size bytes
// and returns them. It returns nil, which fails the guest's memory.grow,
// past the reservation or when the system refuses.
//
// An instance starting from an image is instantiated as usual (wazero
// applies the data segments to the memory's minimum size), then grown to
// the image's size. The first allocation, when smaller than the image,
// is a scratch buffer reused between instantiations, so that applying the
// data segments touches no page of the reservation; the growth maps the
// image over the reservation, copy-on-write, and returns that: the
// scratch's contents are dropped, not copied, as the image replaces them.
//
// wazero's first allocation, of the memory's minimum as it instantiates
// the module, has no way to fail: wazero slices what it gets to the
// minimum, and nil (or less) panics the process. That allocation fails
// when the image is closed under the instantiation (its Compiled closed
// meanwhile: a closed descriptor is not mapped) or the system refuses
// the mapping, so it is then given a buffer of the Go heap, as wazero's
// own allocation would, which the guest never runs on: the error is kept
// in startErr, and instantiate fails the instance (startFailed).
func (m *reservedMemory) Reallocate(size uint64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.reallocateLocked(size)
	switch {
	case err == nil:
		m.started = true
		return b
	case m.started:
		return nil // fails the guest's memory.grow
	}
	m.started, m.startErr = true, err
	return make([]byte, size)
}

// startFailed returns why the memory could not be the reservation's
// when wazero first allocated it, nil when it is. m may be nil.
func (m *reservedMemory) startFailed() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.startErr
}

// errReservation: a size past the reservation, or one already freed.
var errReservation = errors.New("past the memory's reservation, or freed")

func (m *reservedMemory) reallocateLocked(size uint64) ([]byte, error) {
	if m.mem == nil || size > uint64(len(m.mem)) {
		return nil, errReservation
	}
	if m.img != nil && !m.onImage {
		if size < m.imgSize && m.scratch != nil && m.scratchBuf == nil {
			b, _ := m.scratch.Get().(*[]byte)
			if b == nil || uint64(cap(*b)) < size {
				b = new([]byte)
				*b = make([]byte, size)
			}
			m.scratchBuf = b
			return (*b)[:size:size], nil
		}
		m.early = m.scratchBuf == nil
		m.putScratch()
		if m.reused && !m.early {
			m.onImage = true // the image is in place: nothing wrote over it
		} else {
			switch err := m.mapImage(); {
			case errors.Is(err, errors.ErrUnsupported):
				m.img = nil // the image is copied in instead
			case err != nil:
				return nil, fmt.Errorf("map the image: %w", err) // a failed MAP_FIXED may leave the range unmapped
			}
		}
	}
	if size > m.committed {
		if err := commit(m.mem[m.committed:size]); err != nil {
			return nil, err
		}
		m.committed = size
	}
	return m.mem[:size:size], nil
}

func (m *reservedMemory) putScratch() {
	if m.scratchBuf != nil {
		m.scratch.Put(m.scratchBuf)
		m.scratchBuf = nil
	}
}

// settleImage finishes an instance's start from its image, once wazero
// has instantiated the module and grown its memory to the image's size:
// it reports whether the image is mapped, and maps it again where it was
// mapped before the data segments were applied (those writes made private
// copies of the pages they touched; mapping again shares them again).
func (m *reservedMemory) settleImage() (bool, error) {
	if m == nil {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.onImage {
		return false, nil
	}
	if m.early {
		m.early = false
		if err := m.mapImage(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Free implements experimental.LinearMemory. A reservation on its
// image goes back to the image's pool, reset to the image, for the next
// instance (recycle.go); any other is unmapped.
func (m *reservedMemory) Free() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.busy {
		m.freed = true
		return
	}
	if m.onImage && !m.early && m.mem != nil && m.img.recycle(m) {
		m.putScratch()
		m.mem, m.committed = nil, 0 // the pool's now: this one is spent
		return
	}
	m.unmap()
}

func (m *reservedMemory) unmap() {
	m.putScratch()
	if m.mem != nil {
		_ = release(m.mem)
		m.mem, m.committed = nil, 0
	}
}

// enter marks the start of a call into the guest. m may be nil.
func (m *reservedMemory) enter() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.busy = true
	m.mu.Unlock()
}

// enterLive is enter for the host's own access to the memory (a snapshot
// or restore): it reports false, entering nothing, when wazero has freed
// the memory already. m may be nil (wazero's own memory, which the
// garbage collector keeps while it is referenced).
func (m *reservedMemory) enterLive() bool {
	if m == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mem == nil || m.freed {
		return false
	}
	m.busy = true
	return true
}

// exit marks its end, and frees the memory if wazero freed it meanwhile.
func (m *reservedMemory) exit() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy = false
	if m.freed {
		m.unmap()
	}
}

// sliceMemory is the fallback where a reservation fails: a Go slice that
// grows by copying, as wazero's own allocation does.
type sliceMemory struct{ b []byte }

func (m *sliceMemory) Reallocate(size uint64) []byte {
	if size > uint64(cap(m.b)) {
		b := make([]byte, size, max(size, 2*uint64(cap(m.b))))
		copy(b, m.b)
		m.b = b
	}
	m.b = m.b[:size]
	return m.b
}

func (m *sliceMemory) Free() { m.b = nil }
