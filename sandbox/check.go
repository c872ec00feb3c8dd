package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// This file is the pre-compile checker: it walks a module's binary, every
// section and every instruction of every function body, before wazero sees
// it, and refuses a module over a [ModuleLimits] limit. wazero's decoder,
// validator and compiler are linear in the size of ordinary code, but not
// in deeply nested blocks or huge br_tables (50 000 nested loops, in a
// 146 KiB module, kept wazero compiling for minutes), and they cannot be
// interrupted inside one function. The checker is one pass over the bytes,
// allocates nothing in proportion to what the module declares (only to
// what it contains), and stops at the first problem.
//
// It understands the WebAssembly 2.0 binary format (the features wazero
// enables by default: bulk memory, multi-value, non-trapping float-to-int,
// reference types, sign extension, SIMD); anything else is refused naming
// the opcode or section. It does not validate types: wazero does that
// next.

// ModuleLimits bound what a module may ask the compiler to do. A zero field
// means its default (the Default* constants), so ModuleLimits{} is the
// defaults. The defaults are several times what Go, Rust and C plugins
// built with their standard toolchains use (docs/SECURITY.md gives the
// figures), and small enough that compiling a module within them takes
// seconds, not minutes.
type ModuleLimits struct {
	// MaxModuleSize bounds the module's size in bytes. It is also the most
	// the plugins package reads of a plugin file.
	MaxModuleSize uint64
	// MaxFunctions bounds the functions a module imports and defines.
	MaxFunctions uint32
	// MaxFunctionSize bounds one function body, in bytes.
	MaxFunctionSize uint32
	// MaxNesting bounds how deep blocks, loops and ifs nest in a function.
	MaxNesting uint32
	// MaxBlocks bounds the blocks, loops and ifs of one function:
	// wazero's compile time grows with the square of their number (40 000
	// loops in one 120 KiB function took 50 s), and one function's
	// compilation cannot be interrupted.
	MaxBlocks uint32
	// MaxLoops bounds the loops of one function, which cost the compiler
	// far more than blocks (8 000 loops: 2 s; 8 000 blocks: 0.4 s).
	MaxLoops uint32
	// MaxBrTableTargets bounds the br_table targets of one function, all
	// its br_tables together (a 1 000 000-target br_table kept wazero
	// compiling for minutes).
	MaxBrTableTargets uint32
	// MaxLocals bounds the locals one function declares (parameters not
	// counted).
	MaxLocals uint32
	// MaxTables bounds the tables a module defines.
	MaxTables uint32
	// MaxTableSize bounds each table's entries: its minimum, and its
	// growth. A table whose maximum is unset or larger is given this
	// maximum (table.grow past it fails, as the spec allows), since
	// wazero counts tables in no memory limit.
	MaxTableSize uint32
	// MaxSegments bounds the data segments, and separately the element
	// segments, of a module.
	MaxSegments uint32
}

// Defaults of [ModuleLimits]. The largest example plugin (a Go wasip1
// build, 4 MiB) defines 2 503 functions, the largest 61 KiB, nests 400 deep,
// has a br_table of 400 targets and a table of 6 599 entries.
const (
	DefaultMaxModuleSize     = 64 << 20
	DefaultMaxFunctions      = 200_000
	DefaultMaxFunctionSize   = 1 << 20
	DefaultMaxNesting        = 2048
	DefaultMaxBlocks         = 8192
	DefaultMaxLoops          = 2048
	DefaultMaxBrTableTargets = 32768
	DefaultMaxLocals         = 50_000
	DefaultMaxTables         = 16
	DefaultMaxTableSize      = 1 << 18
	DefaultMaxSegments       = 500_000
)

// MaxCustomSections bounds the custom sections of a module. It is fixed,
// not one of [ModuleLimits], since no module needs more: the Go plugins
// the repository builds carry 3, and of 8 158 modules found on a
// developer's machine (TinyGo, Rust, clang and Zig builds, DWARF debug
// ones among them with 9 ".debug_*" and more, wazero's spec tests) none
// carries more than 22. wazero keeps each it is given, at some 15 times a
// tiny one's size (a module of them at the default 64 MiB limit: 1 GB),
// and under [InterruptWazero] it is given the DWARF ones.
const MaxCustomSections = 1024

func (l ModuleLimits) withDefaults() ModuleLimits {
	set64 := func(v *uint64, d uint64) {
		if *v == 0 {
			*v = d
		}
	}
	set := func(v *uint32, d uint32) {
		if *v == 0 {
			*v = d
		}
	}
	set64(&l.MaxModuleSize, DefaultMaxModuleSize)
	set(&l.MaxFunctions, DefaultMaxFunctions)
	set(&l.MaxFunctionSize, DefaultMaxFunctionSize)
	set(&l.MaxNesting, DefaultMaxNesting)
	set(&l.MaxBlocks, DefaultMaxBlocks)
	set(&l.MaxLoops, DefaultMaxLoops)
	set(&l.MaxBrTableTargets, DefaultMaxBrTableTargets)
	set(&l.MaxLocals, DefaultMaxLocals)
	set(&l.MaxTables, DefaultMaxTables)
	set(&l.MaxTableSize, DefaultMaxTableSize)
	set(&l.MaxSegments, DefaultMaxSegments)
	return l
}

// LimitError is a module over one of its [ModuleLimits].
type LimitError struct {
	// Limit is the setting's name in the configuration file, such as
	// "max_nesting".
	Limit string
	// Where is the part of the module that is over, such as "function 12".
	Where string
	Value uint64
	Max   uint64
}

func (e *LimitError) Error() string {
	where := ""
	if e.Where != "" {
		where = e.Where + ": "
	}
	return fmt.Sprintf("%s%d is over the limit %s = %d", where, e.Value, e.Limit, e.Max)
}

// ModuleStats is what [CheckModule] measured of a module: the largest
// value of each quantity [ModuleLimits] bounds.
type ModuleStats struct {
	Size           uint64
	Functions      uint32
	MaxFunctionLen uint32
	MaxNesting     uint32
	MaxBlocks      uint32
	MaxLoops       uint32
	MaxBrTable     uint32
	MaxLocals      uint32
	Tables         uint32
	MaxTableMin    uint32
	DataSegments   uint32
	ElemSegments   uint32
	CustomSections uint32
}

// CheckModule walks the module wasm and checks it against limits (zero
// fields meaning the defaults). It returns what it measured, and an error
// that is a [*LimitError] for a module over a limit, or says where the
// binary is malformed or uses what the checker does not know. It does not
// run or compile anything, and is safe on any bytes.
func CheckModule(wasm []byte, limits ModuleLimits) (ModuleStats, error) {
	c, err := checkModule(wasm, limits)
	return c.stats, err
}

func checkModule(wasm []byte, limits ModuleLimits) (*checker, error) {
	return checkModuleCtx(nil, wasm, limits)
}

// checkModuleCtx is checkModule, given up with ctx's error when ctx ends
// (nil: never), as Compile's deadline covers the check.
func checkModuleCtx(ctx context.Context, wasm []byte, limits ModuleLimits) (*checker, error) {
	c := &checker{ctx: ctx, lim: limits.withDefaults(), data: dataInfo{mergeable: true}}
	return c, c.module(wasm)
}

type checker struct {
	// ctx, if not nil, ends the check with its error, looked at every
	// 16 function bodies.
	ctx     context.Context
	lim     ModuleLimits
	stats   ModuleStats
	r       reader
	imports uint32 // functions imported
	// types and memories count the function types and the memories
	// (imported or defined) of the module.
	types, memories uint32
	// tables are the limits of the tables the module defines, and
	// tableSection where its table section lies, for capTables.
	tables       []tableLimits
	tableSection struct{ id, start, end int }
	// snap is what a host-side snapshot needs to know (snapshot_module.go).
	snap snapInfo
	// data is what merging data segments needs to know (data_merge.go).
	data dataInfo
	// rec, when set, records what instrument needs (interrupt.go).
	rec *instrumentRecord
	// inCode is set while the checker reads a function body.
	inCode bool
}

// tableLimits locates one table type's limits in the module.
type tableLimits struct {
	start, end int // the limits' bytes: flags, min[, max]
	min        uint32
	hasMax     bool
	max        uint32
}

var errTruncated = errors.New("unexpected end")

// reader reads the binary format's primitives. Its error is sticky: after
// the first, every read returns zero.
type reader struct {
	b   []byte
	pos int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("at byte %d: %s", r.pos, fmt.Sprintf(format, args...))
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.pos >= len(r.b) {
		r.fail("%v", errTruncated)
		return 0
	}
	v := r.b[r.pos]
	r.pos++
	return v
}

func (r *reader) bytes(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.pos) {
		r.fail("%v: %d bytes wanted, %d left", errTruncated, n, len(r.b)-r.pos)
		return nil
	}
	v := r.b[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return v
}

// uleb reads an unsigned LEB128 of at most bits bits.
func (r *reader) uleb(bits uint) uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		b := r.byte()
		if r.err != nil {
			return 0
		}
		if shift >= bits || (bits-shift < 7 && b&0x7f>>(bits-shift) != 0) {
			r.fail("integer too large (over %d bits)", bits)
			return 0
		}
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			return v
		}
	}
}

func (r *reader) u32() uint32 { return uint32(r.uleb(32)) }

// sleb skips a signed LEB128 of at most bits bits.
func (r *reader) sleb(bits uint) {
	for n := uint(0); ; n += 7 {
		b := r.byte()
		if r.err != nil {
			return
		}
		if n >= bits {
			r.fail("integer too large (over %d bits)", bits)
			return
		}
		if b&0x80 == 0 {
			return
		}
	}
}

// name skips a UTF-8 name (wazero checks its encoding).
func (r *reader) name() { r.bytes(uint64(r.u32())) }

func (c *checker) over(limit, where string, value, max uint64) error {
	if value <= max {
		return nil
	}
	return &LimitError{Limit: limit, Where: where, Value: value, Max: max}
}

func (c *checker) module(wasm []byte) error {
	c.stats.Size = uint64(len(wasm))
	if err := c.over("max_module_size", "module size in bytes", uint64(len(wasm)), c.lim.MaxModuleSize); err != nil {
		return err
	}
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return errors.New("not a WebAssembly module (no \\0asm magic number)")
	}
	if string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return errors.New("not a WebAssembly core module of version 1 (a component? only core modules are supported)")
	}
	c.r = reader{b: wasm, pos: 8}
	r := &c.r
	for r.pos < len(r.b) && r.err == nil {
		idPos := r.pos
		id := r.byte()
		size := r.u32()
		start := r.pos
		body := r.bytes(uint64(size))
		if r.err != nil {
			break
		}
		if id == 0 {
			if c.stats.CustomSections++; c.stats.CustomSections > MaxCustomSections {
				return fmt.Errorf("more than %d custom sections, the most a module may have (MaxCustomSections)", MaxCustomSections)
			}
		}
		// Each section is read by a reader of its own bytes, so that a
		// section cannot read into the next; offsets stay the module's.
		sr := reader{b: r.b[:start+len(body)], pos: start}
		if id == 4 {
			c.tableSection.id, c.tableSection.start, c.tableSection.end = idPos, start, start+len(body)
		}
		switch {
		case id == 11:
			c.data.section = sectionPos{id: idPos, start: start, end: start + len(body), found: true}
		case id == 12:
			c.data.count = sectionPos{id: idPos, start: start, end: start + len(body), found: true}
		}
		if c.rec != nil && id != 0 && int(id) < len(c.rec.sections) {
			c.rec.sections[id] = sectionPos{id: idPos, start: start, end: start + len(body), found: true}
		}
		switch {
		case id == 7:
			c.snap.exportSection = sectionPos{id: idPos, start: start, end: start + len(body), found: true}
		case id >= 1 && id <= 6:
			c.snap.insertAt = start + len(body) // a new export section goes after these
		}
		if err := c.section(id, &sr); err != nil {
			return fmt.Errorf("section %d: %w", id, err)
		}
		if sr.err == nil && sr.pos != len(sr.b) {
			sr.fail("%d bytes left over at the end of the section", len(sr.b)-sr.pos)
		}
		if sr.err != nil {
			return fmt.Errorf("section %d: %w", id, sr.err)
		}
	}
	if r.err != nil {
		return r.err
	}
	return nil
}

// vec reads a vector's length and calls item that many times, stopping at
// the first error. The length is checked against the bytes left, since
// every item is at least one byte: a declared count costs nothing.
func (c *checker) vec(r *reader, item func(i uint32) error) error {
	n := r.u32()
	if r.err == nil && uint64(n) > uint64(len(r.b)-r.pos) {
		r.fail("a vector of %d items in %d bytes", n, len(r.b)-r.pos)
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		if err := item(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *checker) section(id byte, r *reader) error {
	switch id {
	case 0: // custom
		r.name()
		r.pos = len(r.b)
	case 1: // type
		return c.vec(r, func(uint32) error {
			c.types++
			if f := r.byte(); f != 0x60 && r.err == nil {
				r.fail("type form 0x%02x: only function types (0x60) are supported", f)
			}
			for range 2 {
				c.vec(r, func(uint32) error { c.valType(r); return nil })
			}
			return nil
		})
	case 2: // import
		return c.vec(r, func(uint32) error {
			r.name()
			r.name()
			switch kind := r.byte(); kind {
			case 0x00:
				c.typeIndex(r, "an imported function")
				c.imports++
				c.stats.Functions++
				return c.over("max_functions", "functions", uint64(c.stats.Functions), uint64(c.lim.MaxFunctions))
			case 0x01: // a table: this host provides none, so it fails later
				c.refType(r)
				c.limits(r, false)
			case 0x02:
				c.limits(r, true)
				c.memories++
			case 0x03:
				t := r.pos
				c.valType(r)
				mut := r.byte()
				if r.err == nil {
					if mut != 0 {
						c.snap.refuse("it imports a mutable global, which lives outside the instance")
					}
					c.snap.globals = append(c.snap.globals, globalType{imported: true, valType: r.b[t]})
				}
			default:
				if r.err == nil {
					r.fail("import kind 0x%02x is unknown", kind)
				}
			}
			return nil
		})
	case 3: // function
		return c.vec(r, func(i uint32) error {
			c.typeIndex(r, fmt.Sprintf("function %d", c.imports+i))
			c.stats.Functions++
			return c.over("max_functions", "functions", uint64(c.stats.Functions), uint64(c.lim.MaxFunctions))
		})
	case 4: // table
		return c.vec(r, func(i uint32) error {
			c.refType(r)
			t := c.limits(r, false)
			c.stats.Tables++
			if err := c.over("max_tables", "tables", uint64(c.stats.Tables), uint64(c.lim.MaxTables)); err != nil {
				return err
			}
			c.stats.MaxTableMin = max(c.stats.MaxTableMin, t.min)
			if err := c.over("max_table_size", fmt.Sprintf("table %d minimum entries", i), uint64(t.min), uint64(c.lim.MaxTableSize)); err != nil {
				return err
			}
			c.tables = append(c.tables, t)
			return nil
		})
	case 5: // memory
		return c.vec(r, func(uint32) error { c.limits(r, true); c.memories++; return nil })
	case 6: // global
		return c.vec(r, func(uint32) error {
			t := r.pos
			c.valType(r)
			mut := r.byte()
			if r.err == nil {
				c.snap.globals = append(c.snap.globals, globalType{valType: r.b[t], mutable: mut == 1})
			}
			return c.expr(r, "a global's initialiser")
		})
	case 7: // export
		return c.vec(r, func(uint32) error {
			name := string(r.bytes(uint64(r.u32())))
			k := r.byte()
			if k > 3 && r.err == nil {
				r.fail("export kind 0x%02x is unknown", k)
			}
			idx := r.u32()
			c.snap.export(name, k, idx)
			if c.rec != nil && (name == interruptExport || name == budgetExport || name == startExport) {
				c.rec.clash = name
			}
			return nil
		})
	case 8: // start
		f := r.u32()
		c.snap.hasStart = true
		if c.rec != nil {
			c.rec.startFunc = f
		}
	case 9: // element
		return c.vec(r, func(i uint32) error {
			c.stats.ElemSegments++
			if err := c.over("max_segments", "element segments", uint64(c.stats.ElemSegments), uint64(c.lim.MaxSegments)); err != nil {
				return err
			}
			return c.elem(r)
		})
	case 10: // code
		return c.vec(r, func(i uint32) error { return c.code(r, i) })
	case 11: // data
		return c.vec(r, func(i uint32) error {
			c.stats.DataSegments++
			if err := c.over("max_segments", "data segments", uint64(c.stats.DataSegments), uint64(c.lim.MaxSegments)); err != nil {
				return err
			}
			switch flags := r.u32(); flags {
			case 0:
			case 1:
				r.bytes(uint64(r.u32()))
				c.data.mergeable = false // passive: referred to by index
				return nil
			case 2:
				r.u32()
				c.data.mergeable = false
			default:
				if r.err == nil {
					r.fail("data segment kind %d is unknown", flags)
				}
				return nil
			}
			exprStart := r.pos
			if err := c.expr(r, "a data segment's offset"); err != nil {
				return err
			}
			exprEnd := r.pos
			n := r.u32()
			initStart := r.pos
			r.bytes(uint64(n))
			if r.err == nil {
				c.data.segment(r.b[exprStart:exprEnd], initStart, r.pos)
			}
			return nil
		})
	case 12: // data count
		r.u32()
	default:
		r.fail("section id %d is unknown (a feature this host does not enable?)", id)
	}
	return nil
}

// typeIndex reads a function's type index and refuses one past the types
// declared so far (the type section comes first). wazero v1.12.0 checks
// each function's own index only when it validates that function, after
// validating the functions that call it: a call to a function whose type
// index is out of range panics in its validator (FuzzCheckModule found it).
func (c *checker) typeIndex(r *reader, what string) {
	if t := r.u32(); t >= c.types && r.err == nil {
		r.fail("%s has type index %d, past the %d types declared", what, t, c.types)
	}
}

func (c *checker) valType(r *reader) {
	switch t := r.byte(); t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
	default:
		if r.err == nil {
			r.pos--
			r.fail("value type 0x%02x is unknown", t)
		}
	}
}

func (c *checker) refType(r *reader) {
	if t := r.byte(); t != 0x70 && t != 0x6f && r.err == nil {
		r.pos--
		r.fail("reference type 0x%02x is unknown", t)
	}
}

// limits reads a table's or memory's limits.
func (c *checker) limits(r *reader, memory bool) tableLimits {
	t := tableLimits{start: r.pos}
	flags := r.byte()
	switch {
	case flags == 0 || flags == 1:
	case memory && (flags == 2 || flags == 3): // shared: wazero decides
	default:
		if r.err == nil {
			r.fail("limits flags 0x%02x are unknown", flags)
		}
		return t
	}
	t.min = r.u32()
	if flags&1 != 0 {
		t.hasMax, t.max = true, r.u32()
	}
	t.end = r.pos
	return t
}

func (c *checker) elem(r *reader) error {
	flags := r.u32()
	if flags > 7 {
		if r.err == nil {
			r.fail("element segment kind %d is unknown", flags)
		}
		return nil
	}
	if flags&3 == 2 { // an explicit table index
		r.u32()
	}
	if flags&1 == 0 { // active: an offset
		if err := c.expr(r, "an element segment's offset"); err != nil {
			return err
		}
	}
	exprs := flags&4 != 0
	if flags&3 != 0 { // elemkind or reftype
		if exprs {
			c.refType(r)
		} else if k := r.byte(); k != 0 && r.err == nil {
			r.fail("element kind 0x%02x is unknown", k)
		}
	}
	return c.vec(r, func(uint32) error {
		if exprs {
			return c.expr(r, "an element")
		}
		r.u32()
		return nil
	})
}

// expr reads a constant expression, up to its end.
func (c *checker) expr(r *reader, what string) error {
	return c.instructions(r, what)
}

func (c *checker) code(r *reader, i uint32) error {
	if c.ctx != nil && i%16 == 0 {
		if err := c.ctx.Err(); err != nil {
			return err
		}
	}
	where := fmt.Sprintf("function %d", uint64(c.imports)+uint64(i))
	size := r.u32()
	if r.err != nil {
		return nil
	}
	c.stats.MaxFunctionLen = max(c.stats.MaxFunctionLen, size)
	if err := c.over("max_function_size", where+" size in bytes", uint64(size), uint64(c.lim.MaxFunctionSize)); err != nil {
		return err
	}
	body := r.bytes(uint64(size))
	if r.err != nil {
		return nil
	}
	br := reader{b: r.b[:r.pos], pos: r.pos - len(body)}
	var locals uint64
	err := c.vec(&br, func(uint32) error {
		locals += uint64(br.u32())
		c.valType(&br)
		return c.over("max_locals", where+" locals", locals, uint64(c.lim.MaxLocals))
	})
	if err != nil {
		return err
	}
	c.stats.MaxLocals = max(c.stats.MaxLocals, uint32(locals))
	if c.rec != nil {
		c.rec.bodies = append(c.rec.bodies, bodyPos{start: r.pos - len(body), entry: br.pos, end: r.pos, loops: [2]int{len(c.rec.loops), len(c.rec.loops)}})
	}
	c.inCode = true
	err = c.instructions(&br, where)
	c.inCode = false
	if c.rec != nil {
		c.rec.bodies[len(c.rec.bodies)-1].loops[1] = len(c.rec.loops)
	}
	if err != nil {
		return err
	}
	if br.err == nil && br.pos != len(br.b) {
		br.fail("%d bytes after the end of the function", len(br.b)-br.pos)
	}
	if br.err != nil {
		return fmt.Errorf("%s: %w", where, br.err)
	}
	return nil
}

// instructions reads instructions up to the end that closes the
// expression, bounding nesting and br_table sizes.
func (c *checker) instructions(r *reader, where string) error {
	depth, blocks, loops, targets := uint32(0), uint32(0), uint32(0), uint64(0)
	for {
		op := r.byte()
		if r.err != nil {
			return nil
		}
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			c.blockType(r)
			depth++
			blocks++
			c.stats.MaxNesting = max(c.stats.MaxNesting, depth)
			c.stats.MaxBlocks = max(c.stats.MaxBlocks, blocks)
			if err := c.over("max_blocks", where+" blocks, loops and ifs", uint64(blocks), uint64(c.lim.MaxBlocks)); err != nil {
				return err
			}
			if op == 0x03 {
				if c.rec != nil && c.inCode && r.err == nil {
					c.rec.loops = append(c.rec.loops, r.pos)
				}
				loops++
				c.stats.MaxLoops = max(c.stats.MaxLoops, loops)
				if err := c.over("max_loops", where+" loops", uint64(loops), uint64(c.lim.MaxLoops)); err != nil {
					return err
				}
			}
			if err := c.over("max_nesting", where+" nesting depth", uint64(depth), uint64(c.lim.MaxNesting)); err != nil {
				return err
			}
		case op == 0x0b: // end
			if depth == 0 {
				return nil
			}
			depth--
		case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0f || op == 0x1a || op == 0x1b: // no immediates
		case op == 0x0c || op == 0x0d: // br, br_if
			r.u32()
		case op == 0x0e: // br_table
			n := r.u32()
			targets += uint64(n)
			c.stats.MaxBrTable = max(c.stats.MaxBrTable, uint32(min(targets, 1<<32-1)))
			if err := c.over("max_br_table_targets", where+" br_table targets", targets, uint64(c.lim.MaxBrTableTargets)); err != nil {
				return err
			}
			if r.err == nil && uint64(n) > uint64(len(r.b)-r.pos) {
				r.fail("a br_table of %d targets in %d bytes", n, len(r.b)-r.pos)
			}
			for i := uint32(0); i <= n && r.err == nil; i++ {
				r.u32()
			}
		case op == 0x10: // call
			r.u32()
		case op == 0x11: // call_indirect
			r.u32()
			r.u32()
		case op == 0x1c: // select t*
			c.vec(r, func(uint32) error { c.valType(r); return nil })
		case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
			r.u32()
			if op == 0x26 {
				c.snap.refuse("it changes a table at run time (table.set), and tables are not captured")
			}
		case op >= 0x28 && op <= 0x3e: // loads and stores
			c.memArg(r)
		case op == 0x3f || op == 0x40: // memory.size, memory.grow
			c.memIndex(r)
		case op == 0x41: // i32.const
			r.sleb(32)
		case op == 0x42: // i64.const
			r.sleb(64)
		case op == 0x43:
			r.bytes(4)
		case op == 0x44:
			r.bytes(8)
		case op >= 0x45 && op <= 0xc4: // numeric, sign extension
		case op == 0xd0: // ref.null
			c.refType(r)
		case op == 0xd1: // ref.is_null
		case op == 0xd2: // ref.func
			r.u32()
		case op == 0xfc:
			c.miscOp(r)
		case op == 0xfd:
			c.vectorOp(r)
		default:
			r.pos--
			r.fail("opcode 0x%02x is unknown, or of a feature this host does not enable (tail calls, exceptions, threads, GC)", op)
		}
		if r.err != nil {
			return nil
		}
	}
}

func (c *checker) blockType(r *reader) {
	if r.err != nil || r.pos >= len(r.b) {
		r.byte()
		return
	}
	switch b := r.b[r.pos]; {
	case b == 0x40 || b == 0x7f || b == 0x7e || b == 0x7d || b == 0x7c || b == 0x7b || b == 0x70 || b == 0x6f:
		r.pos++
	case b&0x40 == 0 || b&0x80 != 0: // a type index, as a positive s33
		r.sleb(33)
	default:
		r.fail("block type 0x%02x is unknown", b)
	}
}

func (c *checker) memArg(r *reader) {
	if align := r.u32(); align >= 64 && r.err == nil {
		r.fail("memory alignment %d: multiple memories are not supported", align)
	}
	r.u32()
}

func (c *checker) memIndex(r *reader) {
	if m := r.byte(); m != 0 && r.err == nil {
		r.fail("memory index %d: multiple memories are not supported", m)
	}
}

// miscOp reads a 0xFC-prefixed instruction.
func (c *checker) miscOp(r *reader) {
	switch sub := r.u32(); {
	case r.err != nil:
	case sub <= 7: // saturating truncations
	case sub == 8: // memory.init
		r.u32()
		c.memIndex(r)
		c.data.mergeable = false
	case sub == 9: // data.drop
		r.u32()
		c.data.mergeable = false
		c.snap.refuse("it drops data segments at run time (data.drop), which is not captured")
	case sub == 10: // memory.copy
		c.memIndex(r)
		c.memIndex(r)
	case sub == 11: // memory.fill
		c.memIndex(r)
	case sub == 12 || sub == 14: // table.init, table.copy
		r.u32()
		r.u32()
		c.snap.refuse(fmt.Sprintf("it changes a table at run time (%s), and tables are not captured", map[uint32]string{12: "table.init", 14: "table.copy"}[sub]))
	case sub == 13 || (sub >= 15 && sub <= 17): // elem.drop, table.grow/size/fill
		r.u32()
		if sub != 16 {
			c.snap.refuse(fmt.Sprintf("it changes a table at run time (%s), and tables are not captured", map[uint32]string{13: "elem.drop", 15: "table.grow", 17: "table.fill"}[sub]))
		}
	default:
		r.fail("opcode 0xfc %d is unknown", sub)
	}
}

// vectorOp reads a 0xFD-prefixed (SIMD) instruction.
func (c *checker) vectorOp(r *reader) {
	sub := r.u32()
	switch {
	case r.err != nil:
	case sub <= 11 || sub == 92 || sub == 93: // loads and stores
		c.memArg(r)
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		r.bytes(16)
	case sub >= 21 && sub <= 34: // extract_lane, replace_lane
		r.byte()
	case sub >= 84 && sub <= 91: // load_lane, store_lane
		c.memArg(r)
		r.byte()
	case sub > 255 || !simdNoImmediate(sub):
		r.fail("opcode 0xfd %d is unknown", sub)
	}
}

// simdNoImmediate reports whether sub is a SIMD opcode without immediates
// (those wazero v1.12 defines; the numbering has gaps).
func simdNoImmediate(sub uint32) bool {
	switch sub {
	case 0x9a, 0xa2, 0xa5, 0xa6, 0xaf, 0xb0, 0xb2, 0xb3, 0xb4, 0xbb, 0xc2, 0xc5, 0xc6, 0xcf, 0xd0, 0xd2, 0xd3, 0xd4, 0xe2, 0xee:
		return false
	}
	return (sub >= 14 && sub <= 20) || (sub >= 35 && sub <= 83) || (sub >= 94 && sub <= 255)
}

func appendULEB(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// capTables returns wasm with the maximum of every table whose maximum is
// unset or over MaxTableSize set to MaxTableSize, or wasm itself when no
// table needs it. The spec lets table.grow fail whenever the host
// chooses, so the module behaves as before until it grows a table past
// the cap, where table.grow returns -1. (wazero offers no hook on table
// growth, and Go's wasip1 toolchain writes tables with no maximum, so
// refusing them would refuse every Go plugin.)
func (c *checker) capTables(wasm []byte) []byte {
	limit := c.lim.MaxTableSize
	if !slices.ContainsFunc(c.tables, func(t tableLimits) bool { return !t.hasMax || t.max > limit }) {
		return wasm
	}
	s := c.tableSection
	var content []byte
	pos := s.start
	for _, t := range c.tables {
		content = append(content, wasm[pos:t.start]...)
		if t.hasMax && t.max <= limit {
			content = append(content, wasm[t.start:t.end]...)
		} else {
			content = appendULEB(append(content, 0x01), uint64(t.min))
			content = appendULEB(content, uint64(limit))
		}
		pos = t.end
	}
	content = append(content, wasm[pos:s.end]...)
	out := make([]byte, 0, len(wasm)+len(content)-(s.end-s.start)+5)
	out = append(out, wasm[:s.id]...)
	out = appendULEB(append(out, 4), uint64(len(content)))
	out = append(out, content...)
	return append(out, wasm[s.end:]...)
}
