package testplugins

import "bytes"

// Generators of the large, regular hostile modules of project issue 12
// (compile bombs), shared by the tests of every package that defends
// against them.

// ULEB appends v as an unsigned LEB128.
func ULEB(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// Section appends a module section of the given id and content.
func Section(b []byte, id byte, content []byte) []byte {
	b = ULEB(append(b, id), uint64(len(content)))
	return append(b, content...)
}

// ModuleWithBody returns a module of one function () -> (), exported as
// "f", whose body (locals and instructions, without the final end) is
// body.
func ModuleWithBody(body []byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = Section(m, 1, []byte{1, 0x60, 0, 0})
	m = Section(m, 3, []byte{1, 0})
	m = Section(m, 7, []byte{1, 1, 'f', 0, 0})
	fn := ULEB(nil, uint64(len(body)+1))
	fn = append(append(fn, body...), 0x0b)
	m = Section(m, 10, append(ULEB(nil, 1), fn...))
	return m
}

// NestedLoops is a body of n nested empty loops.
func NestedLoops(n int) []byte {
	b := []byte{0} // no locals
	b = append(b, bytes.Repeat([]byte{0x03, 0x40}, n)...)
	return append(b, bytes.Repeat([]byte{0x0b}, n)...)
}

// NestedBlocks is a body of n nested empty blocks.
func NestedBlocks(n int) []byte {
	b := []byte{0}
	b = append(b, bytes.Repeat([]byte{0x02, 0x40}, n)...)
	return append(b, bytes.Repeat([]byte{0x0b}, n)...)
}

// BrTable is a body with a br_table of n targets, all to depth 0.
func BrTable(n int) []byte {
	b := []byte{0, 0x02, 0x40, 0x41, 0x00, 0x0e}
	b = ULEB(b, uint64(n))
	b = append(b, bytes.Repeat([]byte{0}, n+1)...)
	return append(b, 0x0b)
}
