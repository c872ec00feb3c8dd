package sandbox

import (
	"strings"
	"unicode/utf8"
)

// customSection is a custom section taken out of the bytes wazero
// compiles (see splitCustom).
type customSection struct {
	name string
	data []byte
}

// splitCustom returns wasm without its custom sections but "name" (the
// function names of trap traces) and, when debug is set, the DWARF ones
// (".debug_*", for the source lines of traces), and the sections it took
// out, their data copied.
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
func splitCustom(wasm []byte, debug bool) ([]byte, []customSection) {
	var out []byte
	var taken []customSection
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
		name := string(wasm[r.pos : r.pos+int(nameLen)])
		if !utf8.ValidString(name) {
			// Malformed: wazero refuses it, and must see it to.
			return wasm, nil
		}
		data := wasm[r.pos+int(nameLen) : end]
		r.pos = end
		if name == "name" || (debug && strings.HasPrefix(name, ".debug_")) {
			lastEmpty = name != "name" && len(data) == 0
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(wasm))
		}
		out = append(out, wasm[kept:start]...)
		kept = end
		// Never nil: an empty section is there (a marker, such as
		// plugins.StatelessSection), and CustomSection says so.
		taken = append(taken, customSection{name: name, data: append([]byte{}, data...)})
	}
	if r.err != nil || out == nil || (kept == len(wasm) && lastEmpty) {
		return wasm, nil
	}
	return append(out, wasm[kept:]...), taken
}
