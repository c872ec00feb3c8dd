//go:build wasip1

package guest

import "encoding/binary"

// The Extism kernel imports (module extism:host/env). Offsets are handles
// to host-side memory blocks.

//go:wasmimport extism:host/env input_length
func extismInputLength() uint64

//go:wasmimport extism:host/env input_load_u64
func extismInputLoadU64(index uint64) uint64

//go:wasmimport extism:host/env input_load_u8
func extismInputLoadU8(index uint64) uint32

//go:wasmimport extism:host/env alloc
func extismAlloc(n uint64) uint64

//go:wasmimport extism:host/env free
func extismFree(offset uint64)

//go:wasmimport extism:host/env length
func extismLength(offset uint64) uint64

//go:wasmimport extism:host/env load_u64
func extismLoadU64(offset uint64) uint64

//go:wasmimport extism:host/env load_u8
func extismLoadU8(offset uint64) uint32

//go:wasmimport extism:host/env store_u64
func extismStoreU64(offset, v uint64)

//go:wasmimport extism:host/env store_u8
func extismStoreU8(offset uint64, v uint32)

//go:wasmimport extism:host/env output_set
func extismOutputSet(offset, n uint64)

//go:wasmimport extism:host/env error_set
func extismErrorSet(offset uint64)

// Input returns the bytes the host passed to the current export.
func Input() []byte {
	n := extismInputLength()
	b := make([]byte, n)
	var i uint64
	for ; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], extismInputLoadU64(i))
	}
	for ; i < n; i++ {
		b[i] = byte(extismInputLoadU8(i))
	}
	return b
}

// Output sets the bytes the current export returns to the host.
func Output(b []byte) {
	off := store(b)
	extismOutputSet(off, uint64(len(b)))
}

// SetError sets the error message the host reports when the current export
// returns non-zero.
func SetError(msg string) {
	extismErrorSet(store([]byte(msg)))
}

// store copies b into a new host memory block and returns its offset.
func store(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	off := extismAlloc(uint64(len(b)))
	n := uint64(len(b))
	var i uint64
	for ; i+8 <= n; i += 8 {
		extismStoreU64(off+i, binary.LittleEndian.Uint64(b[i:]))
	}
	for ; i < n; i++ {
		extismStoreU8(off+i, uint32(b[i]))
	}
	return off
}

// load copies the host memory block at off out of the host.
func load(off uint64) []byte {
	if off == 0 {
		return nil
	}
	n := extismLength(off)
	b := make([]byte, n)
	var i uint64
	for ; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], extismLoadU64(off+i))
	}
	for ; i < n; i++ {
		b[i] = byte(extismLoadU8(off + i))
	}
	return b
}

var _ = extismFree
