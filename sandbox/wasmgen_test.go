package sandbox_test

import "bytes"

// uleb appends v as an unsigned LEB128.
func uleb(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func section(b []byte, id byte, content []byte) []byte {
	b = uleb(append(b, id), uint64(len(content)))
	return append(b, content...)
}

// moduleWithBody returns a module of one function () -> (), exported as
// "f", whose body (locals and instructions, without the final end) is
// body.
func moduleWithBody(body []byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = section(m, 1, []byte{1, 0x60, 0, 0})
	m = section(m, 3, []byte{1, 0})
	m = section(m, 7, []byte{1, 1, 'f', 0, 0})
	fn := uleb(nil, uint64(len(body)+1))
	fn = append(append(fn, body...), 0x0b)
	m = section(m, 10, append(uleb(nil, 1), fn...))
	return m
}

// nestedLoops is a body of n nested empty loops.
func nestedLoops(n int) []byte {
	b := []byte{0} // no locals
	b = append(b, bytes.Repeat([]byte{0x03, 0x40}, n)...)
	return append(b, bytes.Repeat([]byte{0x0b}, n)...)
}

// nestedBlocks is a body of n nested empty blocks.
func nestedBlocks(n int) []byte {
	b := []byte{0}
	b = append(b, bytes.Repeat([]byte{0x02, 0x40}, n)...)
	return append(b, bytes.Repeat([]byte{0x0b}, n)...)
}

// brTable is a body with a br_table of n targets, all to depth 0.
func brTable(n int) []byte {
	b := []byte{0, 0x02, 0x40, 0x41, 0x00, 0x0e}
	b = uleb(b, uint64(n))
	b = append(b, bytes.Repeat([]byte{0}, n+1)...)
	return append(b, 0x0b)
}
