package sandbox

import (
	"bytes"
	"unicode/utf8"
)

// customSections are custom sections taken out of the bytes wazero
// compiles (see splitCustom), as they were in the module, one after
// another. Kept as bytes, they take the room they took in the module: a
// slice of them, an element each, took some 78 times that for a module
// of nothing but 3-byte sections.
type customSections []byte

// each calls f with each section's name and data, in order, until f
// returns false.
func (s customSections) each(f func(name, data []byte) bool) {
	r := reader{b: s}
	for r.pos < len(s) && r.err == nil {
		r.byte()
		size := r.u32()
		end := r.pos + int(size)
		name := r.bytes(uint64(r.u32()))
		data := r.bytes(uint64(end - r.pos))
		if r.err != nil || !f(name, data) {
			return
		}
	}
}

// first returns the data of the first section named name, never nil if
// there is one: an empty section is there (a marker, such as
// plugins.StatelessSection), and CustomSection says so.
func (s customSections) first(name string) (data []byte, found bool) {
	s.each(func(n, d []byte) bool {
		if string(n) == name {
			data, found = d, true
		}
		return !found
	})
	return data, found
}

// splitCustom returns wasm without its custom sections but "name" (the
// function names of trap traces) and, when debug is set, the DWARF ones
// (".debug_*", for the source lines of traces), and a copy of the
// sections it took out.
//
// Why: wazero keys its compilation cache on the bytes it is given, so a
// plugin rebuilt with nothing changed but a custom section (a version, a
// manifest, a signature) would compile again from nothing: seconds for a Go
// plugin, 20 s of CPU under the race detector. The sections taken out
// never reach the guest's code; [Compiled.CustomSection] reads them here.
//
// wasm is a module the checker accepted, its section headers sound; on
// any surprise the bytes are returned as they are. The checker leaves
// names' encoding to wazero, so a custom section's name that is not UTF-8
// is one: taken out, it would make a malformed module compile.
func splitCustom(wasm []byte, debug bool) ([]byte, customSections) {
	var out []byte
	var taken customSections
	kept := 0 // wasm[kept:start] is yet to be copied to out
	// lastEmpty: the last section kept is a custom one wazero reads into
	// a buffer (not "name"), with no data. wazero v1.12 refuses a module
	// that ends with one (its reader is at the end: "failed to read
	// custom section name[.debug_x]: EOF"), so it must not be left last
	// where it was not.
	lastEmpty := false
	r := reader{b: wasm, pos: 8}
	for r.pos < len(wasm) && r.err == nil {
		start := r.pos
		id := r.byte()
		size := uint64(r.u32())
		body := r.pos
		if r.err != nil || size > uint64(len(wasm)-body) {
			return wasm, nil
		}
		end := body + int(size)
		if id != 0 {
			r.pos = end
			lastEmpty = false
			continue
		}
		nameLen := uint64(r.u32())
		if r.err != nil || r.pos > end || nameLen > uint64(end-r.pos) {
			return wasm, nil
		}
		name := wasm[r.pos : r.pos+int(nameLen)]
		if !utf8.Valid(name) {
			// Malformed: wazero refuses it, and must see it to.
			return wasm, nil
		}
		empty := r.pos+int(nameLen) == end
		r.pos = end
		if string(name) == "name" || (debug && bytes.HasPrefix(name, []byte(".debug_"))) {
			lastEmpty = string(name) != "name" && empty
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(wasm))
		}
		out = append(out, wasm[kept:start]...)
		kept = end
		taken = append(taken, wasm[start:end]...)
	}
	if r.err != nil || out == nil || (kept == len(wasm) && lastEmpty) {
		return wasm, nil
	}
	return append(out, wasm[kept:]...), taken
}
