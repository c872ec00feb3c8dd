package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/tetratelabs/wazero/api"
)

// This file is the host's own interruption of a running guest (issue 27).
// At compile time, instrument adds to the module one mutable i32 global,
// the interrupt flag, exported to the host only, and a check of it at the
// entry of every function and at the header of every loop:
//
//	global.get $flag  if  unreachable  end
//
// A call's watcher sets the flag when the call's context ends (its
// deadline, or a cancellation); the guest traps at its next check, and
// the call reports the context's error, as wazero's own check did. A
// guest cannot clear the flag: the global is new, so no instruction of
// the guest names its index, and a module's exports are visible to the
// host alone. See docs/DESIGN.md, "Interrupting guests".

// Interruption chooses how a running guest is stopped when its call's
// deadline passes or its call is cancelled. The zero value is
// [InterruptFlag].
type Interruption int

const (
	// InterruptFlag instruments each module with a check of a host-set
	// flag at every function entry and loop header. It costs a load and
	// a branch at each; the default.
	InterruptFlag Interruption = iota
	// InterruptWazero uses wazero's own check (WithCloseOnContextDone),
	// which calls into the runtime at every loop header and function
	// entry: the Go plugins of the benchmarks run 4 to 9 times slower
	// with it. A fallback, should the rewriter meet a module it cannot
	// instrument.
	InterruptWazero
)

// Names of what instrument adds to a module. A guest that exports either
// name itself is refused.
const (
	// interruptExport is the export of the interrupt flag.
	interruptExport = "wasmtools.interrupt"
	// startExport is the export of the module's start function, which
	// instrument removes from the start section so that it runs after
	// instantiation, when the flag can be reached (Compiled.instantiate).
	startExport = "wasmtools.start"
)

// instrumentRecord is what the checker records, in a second pass over the
// module bytes about to be compiled, for instrument: where the sections it
// rewrites are, and where each function body and loop header is.
type instrumentRecord struct {
	global, code, start sectionPos
	startFunc           uint32
	bodies              []bodyPos
	// loops holds, for all functions in order, the offset just after
	// each loop's block type.
	loops []int
	// clash is the export name the guest uses that instrument needs.
	clash string
}

// bodyPos locates a function body: from its first byte (the locals'
// count) to its end, entry just after its locals, and its loops in
// instrumentRecord.loops.
type bodyPos struct {
	start, entry, end int
	loops           [2]int
}

// unlimited is ModuleLimits that nothing is over: instrument's pass is on
// a module already checked against its own.
var unlimited = ModuleLimits{
	MaxModuleSize: math.MaxUint64, MaxFunctions: math.MaxUint32, MaxFunctionSize: math.MaxUint32,
	MaxNesting: math.MaxUint32, MaxBlocks: math.MaxUint32, MaxLoops: math.MaxUint32,
	MaxBrTableTargets: math.MaxUint32, MaxLocals: math.MaxUint32, MaxTables: math.MaxUint32,
	MaxTableSize: math.MaxUint32, MaxSegments: math.MaxUint32,
}

// edit replaces wasm[from:to] by b.
type edit struct {
	from, to int
	b        []byte
}

// instrument returns wasm with the interrupt flag and its checks added:
// a global appended to the global section (the last index, so no
// existing index shifts), exported as interruptExport; the check at the
// entry of each function and after each loop's block type; and the start
// section, if any, replaced by the export startExport. Every other byte
// is kept. wasm must have passed the checker; the result differs in the
// offsets of code, so custom sections that point into code (DWARF) no
// longer match it.
func instrument(wasm []byte) ([]byte, error) {
	c := &checker{lim: unlimited, rec: &instrumentRecord{}}
	if err := c.module(wasm); err != nil {
		return nil, fmt.Errorf("instrument: %w", err)
	}
	rec := c.rec
	if rec.clash != "" {
		return nil, fmt.Errorf("it exports %q, a name the host keeps for its own use", rec.clash)
	}
	flag := uint64(len(c.snap.globals))
	if flag >= math.MaxUint32 {
		return nil, errors.New("instrument: no global index left for the interrupt flag")
	}
	check := appendULEB([]byte{0x23}, flag) // global.get $flag
	check = append(check, 0x04, 0x40, 0x00, 0x0b)

	at := max(c.snap.insertAt, 8) // where a new global or export section goes
	var edits []edit

	global := []byte{0x7f, 0x01, 0x41, 0x00, 0x0b} // mut i32, i32.const 0
	edits = append(edits, vecEdit(wasm, 6, rec.global, at, global))

	exports := appendULEB(nil, uint64(len(interruptExport)))
	exports = append(append(exports, interruptExport...), 0x03)
	exports = appendULEB(exports, flag)
	if rec.start.found {
		exports = appendULEB(exports, uint64(len(startExport)))
		exports = append(append(exports, startExport...), 0x00)
		exports = appendULEB(exports, uint64(rec.startFunc))
		edits = append(edits, edit{from: rec.start.id, to: rec.start.end})
	}
	edits = append(edits, vecEditN(wasm, 7, c.snap.exportSection, at, exports, 1+boolInt(rec.start.found)))

	if rec.code.found {
		r := reader{b: wasm[:rec.code.end], pos: rec.code.start}
		n := r.u32()
		content := appendULEB(make([]byte, 0, rec.code.end-rec.code.start+len(rec.bodies)*len(check)*2), uint64(n))
		for _, b := range rec.bodies {
			loops := rec.loops[b.loops[0]:b.loops[1]]
			size := b.end - b.start + len(check)*(1+len(loops))
			content = appendULEB(content, uint64(size))
			content = append(content, wasm[b.start:b.entry]...)
			content = append(content, check...)
			pos := b.entry
			for _, l := range loops {
				content = append(content, wasm[pos:l]...)
				content = append(content, check...)
				pos = l
			}
			content = append(content, wasm[pos:b.end]...)
		}
		edits = append(edits, edit{rec.code.id, rec.code.end, section(nil, 10, content)})
	}

	slices.SortStableFunc(edits, func(a, b edit) int { return a.from - b.from })
	out := make([]byte, 0, len(wasm)+len(rec.loops)*len(check)+len(rec.bodies)*(len(check)+1)+64)
	pos := 0
	for _, e := range edits {
		out = append(out, wasm[pos:e.from]...)
		out = append(out, e.b...)
		pos = e.to
	}
	return append(out, wasm[pos:]...), nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// vecEdit is vecEditN of one item.
func vecEdit(wasm []byte, id byte, s sectionPos, at int, item []byte) edit {
	return vecEditN(wasm, id, s, at, item, 1)
}

// vecEditN returns the edit that appends items (n of them, encoded) to the
// vector that is section id's content, at s, or adds the section at at
// when the module has none.
func vecEditN(wasm []byte, id byte, s sectionPos, at int, items []byte, n int) edit {
	if !s.found {
		return edit{at, at, section(nil, id, append(appendULEB(nil, uint64(n)), items...))}
	}
	r := reader{b: wasm[:s.end], pos: s.start}
	count := r.u32() // read by the checker
	content := appendULEB(nil, uint64(count)+uint64(n))
	content = append(append(content, wasm[r.pos:s.end]...), items...)
	return edit{s.id, s.end, section(nil, id, content)}
}

// section appends a section of id and content to b.
func section(b []byte, id byte, content []byte) []byte {
	b = appendULEB(append(b, id), uint64(len(content)))
	return append(b, content...)
}

// watchInterrupt arms flag for one call: it clears it, then sets it when
// ctx ends. The returned function disarms it, waiting for a setting under
// way, so that nothing sets the flag once it returns. A nil flag (a module
// wazero interrupts) is a no-op.
func watchInterrupt(ctx context.Context, flag api.MutableGlobal) (disarm func()) {
	if flag == nil {
		return func() {}
	}
	flag.Set(0)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		flag.Set(1)
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}
