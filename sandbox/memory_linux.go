//go:build linux

package sandbox

import "golang.org/x/sys/unix"

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
