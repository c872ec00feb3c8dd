package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/tetratelabs/wazero/api"
)

// This file is the host's own interruption of a running guest (issue 27).
// At compile time, instrument adds to the module two mutable i32 globals,
// the interrupt flag and a budget, both exported to the host only; a
// function, yield; and at the entry of every function and the header of
// every loop a check that spends part of the budget (cost, the bytes of
// code from the check to the end of its function):
//
//	global.get $budget  i32.const cost  i32.sub   global.set $budget
//	global.get $budget  i32.const 0     i32.lt_s  if  call $yield  end
//
// yield runs memory.grow 0, which wazero serves in Go, then traps if the
// flag is set, then refills the budget. A call's watcher sets the flag,
// and empties the budget, when the call's context ends (its deadline, or a
// cancellation); the guest traps at its next check, and the call reports
// the context's error, as wazero's own check did.
//
// The budget exists because native code cannot be preempted by Go: a
// guest that never leaves it would hold its thread through a garbage
// collection's stop-the-world, which would wait for it, and with it
// every goroutine of the host, including the timer that is to stop the
// guest. The trip to Go, every yieldBudget bytes of code run at most, is
// where the goroutine can be preempted. (wazero's own check makes that trip at every loop
// header, hence its cost.)
//
// A guest cannot clear the flag: the globals are new, so no instruction of
// the guest names their indexes, and a module's exports are visible to the
// host alone. See docs/DESIGN.md, "Interrupting guests".

// Interruption chooses how a running guest is stopped when its call's
// deadline passes or its call is cancelled. The zero value is
// [InterruptFlag].
type Interruption int

const (
	// InterruptFlag instruments each module with a check of a host-set
	// flag at every function entry and loop header: a few instructions
	// at each, and now and then a trip to Go. The default.
	InterruptFlag Interruption = iota
	// InterruptWazero uses wazero's own check (WithCloseOnContextDone),
	// which makes a trip to Go at every loop header: the Go plugins of
	// the benchmarks run several times slower with it, and it does not
	// stop recursion without loops. A fallback, should the rewriter meet
	// a module it cannot instrument.
	InterruptWazero
)

// Names of what instrument adds to a module. A guest that exports one of
// them itself is refused.
const (
	// interruptExport is the export of the interrupt flag.
	interruptExport = "wasmtools.interrupt"
	// budgetExport is the export of the budget.
	budgetExport = "wasmtools.budget"
	// startExport is the export of the module's start function, which
	// instrument removes from the start section so that it runs after
	// instantiation, when the flag can be reached (Compiled.instantiate).
	startExport = "wasmtools.start"
)

// yieldBudget is how much code, in bytes, a guest may run between two trips
// to Go (each check is charged the bytes from it to the end of its
// function, see instrument): a few milliseconds at most, what a garbage
// collection may wait for a guest's thread; ordinary code, whose loops are
// short, goes to Go far more often than it would have to. maxCharge caps
// one check's charge, so that the budget cannot wrap around (a function
// over it, allowed only by raising max_function_size past 1 MiB, may run
// longer between trips).
const (
	yieldBudget = 1 << 22
	maxCharge   = 1 << 20
)

// instrumentRecord is what the checker records, in a second pass over the
// module bytes about to be compiled, for instrument: where each section
// is, and where each function body and loop header is.
type instrumentRecord struct {
	sections  [13]sectionPos // by section id
	startFunc uint32
	bodies    []bodyPos
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
	loops             [2]int
}

// sectionRank is each known section's place in a module (the data count
// section, 12, comes before code).
var sectionRank = [13]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9, 12: 10, 10: 11, 11: 12}

// insertAt is where a new section id goes: after the last present section
// that comes before it.
func (r *instrumentRecord) insertAt(id byte) int {
	at := 8
	for i, s := range r.sections {
		if s.found && sectionRank[i] < sectionRank[id] {
			at = max(at, s.end)
		}
	}
	return at
}

// unlimited is ModuleLimits that nothing is over: instrument's pass is on
// a module already checked against its own (and MaxCustomSections, which
// the rewriting adds none to).
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

// instrument returns wasm with the interrupt flag, the budget, yield and
// the checks added. Every index the module uses keeps its meaning: the
// globals, the function and its type are appended after the module's
// own; a memory of no pages is added for yield's memory.grow when the
// module has none. The start section, if any, is replaced by the export
// startExport. wasm must have passed the checker; the result differs in
// the offsets of code, so custom sections that point into code (DWARF)
// no longer match it.
func instrument(wasm []byte) ([]byte, error) { return instrumentCtx(nil, wasm) }

// instrumentCtx is instrument, given up with ctx's error when ctx ends
// (nil: never): Compile's deadline covers it.
func instrumentCtx(ctx context.Context, wasm []byte) ([]byte, error) {
	c := &checker{ctx: ctx, lim: unlimited, rec: &instrumentRecord{}}
	if err := c.module(wasm); err != nil {
		return nil, fmt.Errorf("instrument: %w", err)
	}
	rec := c.rec
	if rec.clash != "" {
		return nil, fmt.Errorf("it exports %q, a name the host keeps for its own use", rec.clash)
	}
	flag, budget := uint64(len(c.snap.globals)), uint64(len(c.snap.globals))+1
	yield, yieldType := uint64(c.stats.Functions), uint64(c.types)
	if budget >= math.MaxUint32 || yield >= math.MaxUint32 || yieldType >= math.MaxUint32 {
		return nil, errors.New("instrument: no index left for the interruption's globals and function")
	}
	// appendCheck appends a check charging cost to the budget. It
	// charges first and then tests what is left, so that the compiled
	// check reads the global once: wazero keeps a global's value from
	// its global.set for a global.get in the same block, but reloads it
	// after the if that may call yield.
	appendCheck := func(b []byte, cost int) []byte {
		b = appendULEB(append(b, 0x23), budget) // global.get $budget
		b = append(sleb32(append(b, 0x41), int32(min(max(cost, 1), maxCharge))), 0x6b, 0x24)
		b = appendULEB(b, budget)                         // i32.const cost, i32.sub, global.set $budget
		b = appendULEB(append(b, 0x23), budget)           // global.get $budget
		b = append(b, 0x41, 0x00, 0x48, 0x04, 0x40, 0x10) // i32.const 0, i32.lt_s, if, call
		return append(appendULEB(b, yield), 0x0b)         // $yield, end
	}

	var edits []edit
	add := func(id byte, items []byte, n int) {
		edits = append(edits, vecEdit(wasm, id, rec.sections[id], rec.insertAt(id), items, n))
	}
	add(1, []byte{0x60, 0x00, 0x00}, 1)
	add(3, appendULEB(nil, yieldType), 1)
	if c.memories == 0 {
		add(5, []byte{0x01, 0x00, 0x00}, 1) // min 0, max 0 pages
	}
	globals := []byte{0x7f, 0x01, 0x41, 0x00, 0x0b, 0x7f, 0x01, 0x41}
	globals = append(sleb32(globals, yieldBudget), 0x0b)
	add(6, globals, 2)

	exports := exportEntry(nil, interruptExport, 0x03, flag)
	exports = exportEntry(exports, budgetExport, 0x03, budget)
	n := 2
	if s := rec.sections[8]; s.found {
		exports = exportEntry(exports, startExport, 0x00, uint64(rec.startFunc))
		edits = append(edits, edit{from: s.id, to: s.end})
		n++
	}
	add(7, exports, n)

	body := []byte{0x00, 0x41, 0x00, 0x40, 0x00, 0x1a}  // no locals; i32.const 0, memory.grow, drop
	body = append(appendULEB(append(body, 0x23), flag), // global.get $flag
		0x04, 0x40, 0x00, 0x0b, 0x41) // if unreachable end, i32.const
	body = appendULEB(append(sleb32(body, yieldBudget), 0x24), budget) // budget, global.set $budget
	body = append(body, 0x0b)
	// Each check is charged the bytes from it to the end of its function:
	// code runs forward between two checks (a backward branch goes to a
	// loop header), so what runs between two trips to Go is at most the
	// budget plus one charge, in bytes of code.
	code := make([]byte, 0, rec.sections[10].end-rec.sections[10].start+(len(rec.bodies)+len(rec.loops))*24+len(body)+8)
	var fn []byte
	for _, b := range rec.bodies {
		loops := rec.loops[b.loops[0]:b.loops[1]]
		fn = append(fn[:0], wasm[b.start:b.entry]...)
		fn = appendCheck(fn, b.end-b.entry)
		pos := b.entry
		for _, l := range loops {
			fn = append(fn, wasm[pos:l]...)
			fn = appendCheck(fn, b.end-l)
			pos = l
		}
		fn = append(fn, wasm[pos:b.end]...)
		code = append(appendULEB(code, uint64(len(fn))), fn...)
	}
	code = append(appendULEB(code, uint64(len(body))), body...)
	if s := rec.sections[10]; s.found {
		edits = append(edits, edit{s.id, s.end, section(nil, 10, append(appendULEB(nil, uint64(len(rec.bodies))+1), code...))})
	} else {
		edits = append(edits, edit{rec.insertAt(10), rec.insertAt(10), section(nil, 10, append([]byte{1}, code...))})
	}

	slices.SortStableFunc(edits, func(a, b edit) int { return a.from - b.from })
	out := make([]byte, 0, len(wasm)+len(code)+256)
	pos := 0
	for _, e := range edits {
		out = append(out, wasm[pos:e.from]...)
		out = append(out, e.b...)
		pos = e.to
	}
	return append(out, wasm[pos:]...), nil
}

func exportEntry(b []byte, name string, kind byte, idx uint64) []byte {
	b = appendULEB(b, uint64(len(name)))
	return appendULEB(append(append(b, name...), kind), idx)
}

// sleb32 appends v as a signed LEB128.
func sleb32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// vecEdit returns the edit that appends items (n of them, encoded) to the
// vector that is section id's content, at s, or adds the section at at
// when the module has none.
func vecEdit(wasm []byte, id byte, s sectionPos, at int, items []byte, n int) edit {
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

// interrupter sets an instance's interrupt flag and empties its budget
// when its call ends: as the context it is armed with ends, and as the
// call's deadline or Close ends the call (they set it themselves, after
// cancelling the call's context, so that the guest's trap finds it done).
// One per instance, reused by its calls (one at a time); nil (a module
// wazero interrupts) does nothing.
type interrupter struct {
	flag, budget api.MutableGlobal
	fire         func() // i.set, made once
	// pending counts the armed call's setting that has not run to its
	// end: one from arm until the setting ran or was stopped.
	pending sync.WaitGroup
}

func newInterrupter(flag, budget api.MutableGlobal) *interrupter {
	w := &interrupter{flag: flag, budget: budget}
	w.fire = w.set
	return w
}

// set interrupts the guest as the armed context ends.
func (w *interrupter) set() {
	w.interrupt()
	w.pending.Done()
}

// interrupt sets the flag and empties the budget. Its callers other than
// set hold what keeps the call from ending meanwhile (the deadline's
// lock, the module's calls' lock, or run on the guest's goroutine).
func (w *interrupter) interrupt() {
	if w == nil {
		return
	}
	w.flag.Set(1)
	w.budget.Set(0)
}

// arm clears the flag, then has it set when ctx ends, until disarm. A
// context that never ends (no Done channel) costs no AfterFunc.
func (w *interrupter) arm(ctx context.Context) (stop func() bool) {
	if w == nil {
		return nil
	}
	w.flag.Set(0)
	if ctx.Done() == nil {
		return nil
	}
	if ctx.Err() != nil {
		// Ended already: the guest stops at its first check, as it
		// would once AfterFunc's goroutine ran, which a loaded machine
		// runs late (a short guest, a start function, ran to its end:
		// TestFailedStartAsksStoredAgain failed so under -race about
		// once in 30).
		w.interrupt()
		return nil
	}
	w.pending.Add(1)
	return context.AfterFunc(ctx, w.fire)
}

// disarm ends the call armed with stop (arm's result). Once it returns
// nothing sets the flag from the armed context: a setting already
// started has finished (the next arm clears what it set), and none can
// start.
func (w *interrupter) disarm(stop func() bool) {
	if w == nil || stop == nil {
		return
	}
	if stop() {
		w.pending.Done()
	}
	w.pending.Wait()
}
