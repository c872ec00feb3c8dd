package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// progGen generates, from fuzz bytes, a valid module of functions
// (i32, i32) -> i32 that always ends: loops count down a counter local of
// their own, and a function calls only functions before it. Its bodies
// use every shape of control flow the instrumentation meets (blocks,
// loops with and without parameters, ifs, br, br_if, br_table dispatch
// loops, return) and instructions of each proposal wazero enables: SIMD,
// bulk memory, sign extension, non-trapping float-to-int, reference
// types, multi-value. Some programs trap (division by zero, memory out of
// bounds): the instrumented module must trap the same way.
type progGen struct {
	in     []byte
	fn     int // the function being generated
	locals int // locals used so far, after the two parameters
	depth  int
	loops  int // loops the expression being generated is in
	calls  int // calls the function makes, at most genCalls
}

const (
	genLocals   = 48 // i32 locals each function declares
	genMaxDepth = 4
	genFuncs    = 4
	// genCalls bounds the calls of one function, which are never in a
	// loop, so that a program's running time stays small.
	genCalls = 3
	// type indexes: 0 is (i32, i32) -> i32, 1 is (i32) -> i32 (loops and
	// blocks with a parameter), 2 is (i32) -> (i32, i32) (multi-value).
	typeBinary, typeUnary, typeSplit = 0, 1, 2
)

func (g *progGen) next() byte {
	if len(g.in) == 0 {
		return 0
	}
	b := g.in[0]
	g.in = g.in[1:]
	return b
}

// local allocates a fresh i32 local, or returns -1 when none is left.
func (g *progGen) local() int {
	if g.locals == genLocals {
		return -1
	}
	g.locals++
	return 1 + g.locals // after the parameters 0 and 1
}

func uleb(b []byte, v uint64) []byte { return appendULEB(b, v) }

func localOp(b []byte, op byte, i int) []byte { return uleb(append(b, op), uint64(i)) }

// expr appends instructions that leave exactly one i32 on the stack.
func (g *progGen) expr(b []byte) []byte {
	g.depth++
	defer func() { g.depth-- }()
	choice := g.next()
	if g.depth > genMaxDepth {
		choice %= 2
	}
	switch choice % 20 {
	case 0:
		return sleb32(append(b, 0x41), int32(int8(g.next()))*int32(g.next()))
	case 1:
		return localOp(b, 0x20, int(g.next()%2))
	case 2, 3: // a binary operator
		b = g.expr(b)
		b = g.expr(b)
		ops := []byte{0x6a, 0x6b, 0x6c, 0x71, 0x72, 0x73, 0x74, 0x76, 0x77, 0x6e, 0x6f, 0x4b, 0x46}
		return append(b, ops[int(g.next())%len(ops)])
	case 4: // call an earlier function
		if g.fn == 0 || g.loops > 0 || g.calls == genCalls {
			return g.expr(b)
		}
		g.calls++
		b = g.expr(b)
		b = g.expr(b)
		return uleb(append(b, 0x10), uint64(int(g.next())%g.fn))
	case 5: // if/else
		b = g.expr(b)
		b = append(b, 0x04, 0x7f)
		b = g.expr(b)
		b = append(b, 0x05)
		b = g.expr(b)
		return append(b, 0x0b)
	case 6: // a block left early with br_if
		b = append(b, 0x02, 0x7f)
		b = g.expr(b)
		b = g.expr(b)
		b = append(b, 0x0d, 0x00, 0x1a)
		b = g.expr(b)
		return append(b, 0x0b)
	case 7, 8: // a counted loop, accumulating into a local
		c, a := g.local(), g.local()
		if a < 0 {
			return g.expr(b)
		}
		b = localOp(sleb32(append(b, 0x41), int32(1+g.next()%3)), 0x21, c)
		b = localOp(g.expr(b), 0x21, a)
		b = append(b, 0x03, 0x40)
		b = localOp(b, 0x20, a)
		g.loops++
		b = g.expr(b)
		g.loops--
		b = localOp(append(b, 0x6a), 0x21, a)
		b = localOp(b, 0x20, c)
		b = localOp(append(b, 0x41, 0x01, 0x6b), 0x22, c)
		b = append(b, 0x0d, 0x00, 0x0b)
		return localOp(b, 0x20, a)
	case 9: // a counted loop with a parameter and a result
		c := g.local()
		if c < 0 {
			return g.expr(b)
		}
		b = localOp(sleb32(append(b, 0x41), int32(1+g.next()%3)), 0x21, c)
		b = g.expr(b)
		b = append(b, 0x03, typeUnary)
		g.loops++
		b = append(g.expr(b), 0x6a)
		g.loops--
		b = localOp(b, 0x20, c)
		b = localOp(append(b, 0x41, 0x01, 0x6b), 0x22, c)
		return append(b, 0x0d, 0x00, 0x0b)
	case 10: // a br_table dispatch loop
		c, r := g.local(), g.local()
		if r < 0 {
			return g.expr(b)
		}
		b = localOp(sleb32(append(b, 0x41), int32(g.next()%4)), 0x21, c)
		b = localOp(g.expr(b), 0x21, r)
		b = append(b, 0x02, 0x40, 0x03, 0x40) // block $out, loop $top
		g.loops++
		defer func() { g.loops-- }()
		b = localOp(b, 0x20, c)
		b = append(b, 0x45, 0x0d, 0x01) // br_if $out when c == 0
		b = localOp(b, 0x20, c)
		b = localOp(append(b, 0x41, 0x01, 0x6b), 0x21, c)
		b = append(b, 0x02, 0x40, 0x02, 0x40) // block $b1, block $b0
		b = g.expr(b)
		b = append(b, 0x0e, 0x03, 0x00, 0x01, 0x02, 0x03, 0x0b) // br_table $b0 $b1 $top $out; end $b0
		b = localOp(b, 0x20, r)
		b = localOp(append(g.expr(b), 0x6a), 0x21, r)
		b = append(b, 0x0c, 0x01, 0x0b) // br $top; end $b1
		b = localOp(b, 0x20, r)
		b = localOp(append(g.expr(b), 0x73), 0x21, r)
		b = append(b, 0x0c, 0x00, 0x0b, 0x0b) // br $top; end loop; end block
		return localOp(b, 0x20, r)
	case 11: // multi-value: a block of two results, combined
		b = g.expr(b)
		b = append(b, 0x02, typeSplit)
		b = append(g.expr(b), 0x0b, 0x6c)
		return b
	case 12: // return from within an expression
		b = append(b, 0x02, 0x7f)
		b = g.expr(b)
		if g.next()%4 == 0 {
			b = append(b, 0x0f)
		}
		return append(b, 0x0b)
	case 13: // memory: store then load
		b = g.expr(b)
		b = append(b, 0x41)
		b = sleb32(b, 0xfc)
		b = append(b, 0x71) // address & 0xfc
		b = g.expr(b)
		b = append(b, 0x36, 0x02, 0x00) // i32.store
		b = g.expr(b)
		return append(b, 0x28, 0x02, 0x00) // i32.load, possibly out of bounds
	case 14: // SIMD: splat, add, extract
		b = append(g.expr(b), 0xfd, 0x11) // i32x4.splat
		b = append(g.expr(b), 0xfd, 0x11)
		b = append(b, 0xfd, 0xae, 0x01) // i32x4.add
		return append(b, 0xfd, 0x1b, g.next()%4)
	case 15: // bulk memory: fill, then copy, a few bytes
		b = append(b, 0x41, 0x08)
		b = g.expr(b)
		b = append(b, 0x41, 0x10, 0xfc, 0x0b, 0x00) // memory.fill 8, v, 16
		b = append(b, 0x41, 0x20, 0x41, 0x08, 0x41, 0x08, 0xfc, 0x0a, 0x00, 0x00)
		return append(b, 0x41, 0x20, 0x28, 0x02, 0x00)
	case 16: // sign extension and non-trapping conversion
		b = append(g.expr(b), 0xc0)        // i32.extend8_s
		return append(b, 0xb2, 0xfc, 0x00) // f32.convert_i32_s, i32.trunc_sat_f32_s
	case 17: // reference types: a null test, and a table read
		b = append(b, 0xd0, 0x70, 0xd1) // ref.null func, ref.is_null
		b = append(b, 0x41, 0x00, 0x25, 0x00, 0xd1, 0x6a)
		return b
	case 18: // the mutable global, and select
		b = append(g.expr(b), 0x24, 0x00, 0x23, 0x00)
		b = g.expr(b)
		b = g.expr(b)
		return append(b, 0x1b)
	default: // i64 arithmetic
		b = append(g.expr(b), 0xac)
		b = append(g.expr(b), 0xad, 0x7e, 0xa7) // i64.mul, i32.wrap
		return b
	}
}

// module generates the module: genFuncs functions f0..f3, exported, a
// memory of one page, a mutable global and a table of the functions.
func (g *progGen) module() []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = section(m, 1, []byte{3,
		0x60, 2, 0x7f, 0x7f, 1, 0x7f,
		0x60, 1, 0x7f, 1, 0x7f,
		0x60, 1, 0x7f, 2, 0x7f, 0x7f})
	m = section(m, 3, append([]byte{genFuncs}, make([]byte, genFuncs)...))
	m = section(m, 4, []byte{1, 0x70, 0x00, genFuncs})
	m = section(m, 5, []byte{1, 0x00, 0x01})
	m = section(m, 6, []byte{1, 0x7f, 0x01, 0x41, 0x00, 0x0b})
	var exports []byte
	exports = append(exports, genFuncs)
	for i := range genFuncs {
		exports = append(exports, 2, 'f', byte('0'+i), 0x00, byte(i))
	}
	m = section(m, 7, exports)
	m = section(m, 9, []byte{1, 0x00, 0x41, 0x00, 0x0b, genFuncs, 0, 1, 2, 3})
	code := []byte{genFuncs}
	for i := range genFuncs {
		g.fn, g.locals, g.depth, g.calls = i, 0, 0, 0
		body := []byte{1, genLocals, 0x7f}
		body = append(g.expr(body), 0x0b)
		code = uleb(code, uint64(len(body)))
		code = append(code, body...)
	}
	return section(m, 10, code)
}

// FuzzInterrupt generates terminating programs (progGen) and runs each
// export of the original and of the instrumented module with the same
// arguments: the results, or traps, must be the same. The instrumented
// module must validate, and with its flag set and its budget spent, every
// export must trap.
func FuzzInterrupt(f *testing.F) {
	for _, s := range []string{"", "\x07\x02\x00\x05", "\x0a\x03\x02\x00\x01\x02\x00\x03", "\x09\x02\x03\x00\x07\x01\x00\x05", "\x0b\x02\x0e\x0f\x10\x11\x12\x13", "\x04\x09\x03\x0a\x02\x08\x01\x06\x0c\x0d"} {
		f.Add([]byte(s), int32(3), int32(-7))
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig())
	f.Cleanup(func() { rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, in []byte, x, y int32) {
		if len(in) > 512 {
			in = in[:512]
		}
		g := &progGen{in: in}
		wasm := g.module()
		orig, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			t.Fatalf("the generated module does not compile (a generator bug): %v", err)
		}
		defer orig.Close(ctx)
		inst, err := instrument(wasm)
		if err != nil {
			t.Fatalf("instrument: %v", err)
		}
		mod, err := rt.CompileModule(ctx, inst)
		if err != nil {
			t.Fatalf("the instrumented module does not compile: %v", err)
		}
		defer mod.Close(ctx)
		a, err := rt.InstantiateModule(ctx, orig, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		b, err := rt.InstantiateModule(ctx, mod, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		for i := range genFuncs {
			name := fmt.Sprintf("f%d", i)
			want, werr := a.ExportedFunction(name).Call(ctx, api.EncodeI32(x), api.EncodeI32(y))
			got, gerr := b.ExportedFunction(name).Call(ctx, api.EncodeI32(x), api.EncodeI32(y))
			if (werr == nil) != (gerr == nil) || (werr != nil && trapKind(werr) != trapKind(gerr)) {
				t.Fatalf("%s: original: %v, %v; instrumented: %v, %v", name, want, werr, got, gerr)
			}
			if werr == nil && uint32(want[0]) != uint32(got[0]) {
				t.Fatalf("%s(%d, %d) = %d; instrumented: %d", name, x, y, int32(want[0]), int32(got[0]))
			}
		}
		b.ExportedGlobal(interruptExport).(api.MutableGlobal).Set(1)
		b.ExportedGlobal(budgetExport).(api.MutableGlobal).Set(0)
		for i := range genFuncs {
			name := fmt.Sprintf("f%d", i)
			if _, err := b.ExportedFunction(name).Call(ctx, api.EncodeI32(x), api.EncodeI32(y)); err == nil || trapKind(err) != "unreachable" {
				t.Fatalf("%s with the flag set: %v; want the unreachable trap", name, err)
			}
		}
	})
}

// trapKind is the first line of a wazero trap's message: its kind.
func trapKind(err error) string {
	var s string
	if err != nil {
		s, _, _ = strings.Cut(err.Error(), "\n")
	}
	if strings.Contains(s, "unreachable") {
		return "unreachable"
	}
	return s
}

// TestInstrumentPlugins instruments every plugin the repository builds:
// each must instrument and compile, and the instrumentation's time is
// logged beside the largest's size.
func TestInstrumentPlugins(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	for _, f := range builtPlugins(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checkModule(b, ModuleLimits{}); err != nil {
			continue // a hostile fixture the checker refuses
		}
		start := time.Now()
		out, err := instrument(b)
		took := time.Since(start)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(b) > 1<<20 {
			t.Logf("%s: %d bytes instrumented in %v, %d bytes more", filepath.Base(f), len(b), took, len(out)-len(b))
		}
		mod, err := rt.CompileModule(ctx, out)
		if err != nil {
			t.Errorf("%s: the instrumented module does not compile: %v", f, err)
			continue
		}
		mod.Close(ctx)
	}
}
