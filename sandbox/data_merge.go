package sandbox

import (
	"cmp"
	"slices"
)

// Merging data segments: Go's wasip1 linker writes tens of thousands of
// small active data segments (38 000 in the servlet test plugin, for 1.7
// MiB of data), and wazero keeps a slice header for each in every
// instance (24 bytes each: 0.9 MiB per instance) and evaluates each
// offset at every instantiation. Segments that lie in ascending order
// with small gaps between them are merged, the gaps written as zeros, so
// that instances are smaller and start faster; the memory they leave is
// the same byte for byte.

// dataInfo is what the checker records about data segments.
type dataInfo struct {
	section, count sectionPos
	// mergeable is cleared by anything that makes merging unsafe: a
	// passive segment or one with an explicit memory, memory.init or
	// data.drop (which name segments by index), a segment whose offset
	// is not a constant; mergeData also refuses overlapping segments (a
	// merged gap must not cover bytes another segment writes, and then
	// the order they are applied in does not matter).
	mergeable bool
	segs      []dataSeg
}

// dataSeg is one active segment at a constant offset: its bytes are
// wasm[start:end].
type dataSeg struct {
	offset     uint32
	start, end int
}

// segment records an active segment whose offset expression is expr and
// whose bytes are wasm[start:end].
func (d *dataInfo) segment(expr []byte, start, end int) {
	if !d.mergeable {
		return
	}
	// Only `i32.const K; end`.
	if len(expr) < 3 || expr[0] != 0x41 || expr[len(expr)-1] != 0x0b {
		d.mergeable = false
		return
	}
	k, n := readSLEB32(expr[1 : len(expr)-1])
	if n != len(expr)-2 {
		d.mergeable = false
		return
	}
	d.segs = append(d.segs, dataSeg{offset: uint32(k), start: start, end: end})
}

// readSLEB32 decodes a signed LEB128 of at most 32 bits, returning the
// value and the bytes read (0 when b is not one).
func readSLEB32(b []byte) (int32, int) {
	var v int64
	var shift uint
	for i, c := range b {
		if i >= 5 {
			return 0, 0
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			if v < -1<<31 || v > 1<<31-1 {
				return 0, 0
			}
			return int32(v), i + 1
		}
	}
	return 0, 0
}

func appendSLEB32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if x == 0 && c&0x40 == 0 || x == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

const (
	// maxDataGap is the largest gap between two segments that merging
	// fills with zeros.
	maxDataGap = 1024
	// maxDataGrowth bounds the zeros merging adds to a module.
	maxDataGrowth = 1 << 20
)

// mergeData returns wasm with runs of its data segments merged (see the
// top of this file), and its data count section updated, or wasm itself
// when nothing is to merge. It must run before the rewrites of earlier
// sections (exportGlobals, capTables), whose offsets it leaves valid.
func (c *checker) mergeData(wasm []byte) []byte {
	d := &c.data
	if !d.mergeable || !d.section.found || len(d.segs) < 2 {
		return wasm
	}
	// The rewrite changes bytes from the data count section on; every
	// section another rewrite changes must lie before (as the binary
	// format's order has it; wazero refuses a module out of order).
	first := d.section.id
	if d.count.found {
		if d.count.end > d.section.id {
			return wasm
		}
		first = d.count.id
	}
	if c.snap.exportSection.end > first || c.tableSection.end > first || c.snap.insertAt > first {
		return wasm
	}
	segs := slices.Clone(d.segs)
	slices.SortStableFunc(segs, func(a, b dataSeg) int { return cmp.Compare(a.offset, b.offset) })
	for i := 1; i < len(segs); i++ {
		if prev := segs[i-1]; uint64(segs[i].offset) < uint64(prev.offset)+uint64(prev.end-prev.start) {
			return wasm
		}
	}
	type run struct {
		offset uint32
		segs   []dataSeg
		size   uint64
	}
	var runs []run
	growth := 0
	for _, s := range segs {
		if l := len(runs); l > 0 {
			r := &runs[l-1]
			gap := uint64(s.offset) - (uint64(r.offset) + r.size)
			if gap <= maxDataGap && growth+int(gap) <= maxDataGrowth {
				growth += int(gap)
				r.segs = append(r.segs, s)
				r.size += gap + uint64(s.end-s.start)
				continue
			}
		}
		runs = append(runs, run{offset: s.offset, segs: []dataSeg{s}, size: uint64(s.end - s.start)})
	}
	if len(runs) == len(d.segs) {
		return wasm
	}
	content := appendULEB(nil, uint64(len(runs)))
	for _, r := range runs {
		content = append(content, 0x00, 0x41)
		content = appendSLEB32(content, int32(r.offset))
		content = append(content, 0x0b)
		content = appendULEB(content, r.size)
		at := uint64(r.offset)
		for _, s := range r.segs {
			content = append(content, make([]byte, uint64(s.offset)-at)...)
			content = append(content, wasm[s.start:s.end]...)
			at = uint64(s.offset) + uint64(s.end-s.start)
		}
	}
	out := make([]byte, 0, len(wasm)+growth+16)
	if dc := d.count; dc.found {
		out = append(out, wasm[:dc.id]...)
		out = appendULEB(append(out, 12), uint64(len(appendULEB(nil, uint64(len(runs))))))
		out = appendULEB(out, uint64(len(runs)))
		out = append(out, wasm[dc.end:d.section.id]...)
	} else {
		out = append(out, wasm[:d.section.id]...)
	}
	out = appendULEB(append(out, 11), uint64(len(content)))
	out = append(out, content...)
	return append(out, wasm[d.section.end:]...)
}
