//go:build !linux

package sandbox

import (
	"errors"
	"time"
)

// reserveMemory reserves nothing where it is not implemented: instances
// use wazero's own allocation, which copies memory as it grows.
func reserveMemory(max uint64) *reservedMemory { return nil }

func commit(b []byte) error  { return errors.ErrUnsupported }
func release(b []byte) error { return nil }

// imageFile is not used where memory is not reserved: images are copied.
type imageFile struct{}

func newImageFile([]byte) (*imageFile, error) { return nil, errors.ErrUnsupported }
func (f *imageFile) bytes() ([]byte, error)   { return nil, errors.ErrUnsupported }
func (f *imageFile) close()                   {}
func (m *reservedMemory) mapImage() error     { return errors.ErrUnsupported }

func (f *imageFile) take(uint64) *reservedMemory  { return nil }
func (f *imageFile) recycle(*reservedMemory) bool { return false }
func (f *imageFile) pooled() int                  { return 0 }

// writtenPieces: only Linux says which pages were written.
func writtenPieces([]byte) []uint64 { return nil }

// scanWrites: only Linux says which pages were written since a scan.
func (m *reservedMemory) scanWrites([]byte, bool, bool) ([]uint64, bool, bool) {
	return nil, false, false
}

// registeredForWrites: only Linux tracks writes.
func (m *reservedMemory) registeredForWrites() bool { return false }

// trackingPaysByDefault: only Linux tracks writes.
func trackingPaysByDefault() bool { return false }

// trackingCosts: only Linux tracks writes.
func trackingCosts() (write, hash time.Duration, ok bool) { return 0, 0, false }

// writeTracker: no userfaultfd off Linux.
func writeTracker() int { return -1 }

// TracksWrites: only Linux says which pages were written.
func TracksWrites() bool { return false }

// WriteTracking: only Linux says which pages were written.
func WriteTracking() (bool, string) { return false, "only Linux tracks writes" }
