package sandbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmtools/wasmtools/abi"
)

// fuzzOp is one host function the kernel fuzzer may call.
type fuzzOp struct {
	name   string
	fn     api.Function
	params int
}

// fuzzOps returns the host functions of extism:host/env (but http_request,
// which only refuses) and those of extism:host/user that take a block, as
// re-exported by a guest module, since wazero does not let the embedder
// call a host module's functions directly.
func fuzzOps(tb testing.TB) []fuzzOp {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	tb.Cleanup(func() { rt.Close(ctx) })
	if err := instantiateKernel(ctx, rt); err != nil {
		tb.Fatal(err)
	}
	if err := instantiateUser(ctx, rt); err != nil {
		tb.Fatal(err)
	}
	var defs []api.FunctionDefinition
	for _, modName := range []string{abi.EnvModule, abi.UserModule} {
		all := rt.Module(modName).ExportedFunctionDefinitions()
		for _, name := range []string{
			abi.FuncAlloc, abi.FuncFree, abi.FuncLength, abi.FuncLengthUnsafe,
			abi.FuncLoadU8, abi.FuncLoadU64, abi.FuncStoreU8, abi.FuncStoreU64,
			abi.FuncInputLength, abi.FuncInputOffset, abi.FuncInputLoadU8, abi.FuncInputLoadU64, abi.FuncInputSet,
			abi.FuncOutputSet, abi.FuncOutputLength, abi.FuncOutputOffset,
			abi.FuncErrorSet, abi.FuncErrorGet, abi.FuncReset, abi.FuncMemoryBytes,
			abi.FuncConfigGet, abi.FuncVarGet, abi.FuncVarSet, abi.FuncLogInfo,
			abi.FuncNotifyProgress, abi.FuncCreateElicitation, abi.FuncWriteRecord,
		} {
			if d := all[name]; d != nil {
				defs = append(defs, d)
			}
		}
	}
	if len(defs) != 27 {
		tb.Fatalf("%d host functions to fuzz, want 27", len(defs))
	}
	mod, err := rt.InstantiateWithConfig(ctx, reexports(defs), wazero.NewModuleConfig().WithName("fuzz"))
	if err != nil {
		tb.Fatal(err)
	}
	ops := make([]fuzzOp, len(defs))
	for i, d := range defs {
		ops[i] = fuzzOp{name: d.ModuleName() + "." + d.ExportNames()[0], fn: mod.ExportedFunction(fmt.Sprint(i)), params: len(d.ParamTypes())}
	}
	return ops
}

// reexports assembles a module that imports each function of defs and
// exports it again, under its index in defs.
func reexports(defs []api.FunctionDefinition) []byte {
	uleb := func(b []byte, v int) []byte {
		for {
			c := byte(v & 0x7f)
			v >>= 7
			if v != 0 {
				c |= 0x80
			}
			b = append(b, c)
			if v == 0 {
				return b
			}
		}
	}
	name := func(b []byte, s string) []byte { return append(uleb(b, len(s)), s...) }
	section := func(out []byte, id byte, body []byte) []byte {
		return append(uleb(append(out, id), len(body)), body...)
	}
	types := uleb(nil, len(defs))
	imports := uleb(nil, len(defs))
	exports := uleb(nil, len(defs))
	for i, d := range defs {
		types = append(types, 0x60)
		for _, ts := range [][]api.ValueType{d.ParamTypes(), d.ResultTypes()} {
			types = uleb(types, len(ts))
			types = append(types, ts...)
		}
		imports = name(name(imports, d.ModuleName()), d.ExportNames()[0])
		imports = uleb(append(imports, 0), i)
		exports = uleb(append(name(exports, fmt.Sprint(i)), 0), i)
	}
	out := []byte("\x00asm\x01\x00\x00\x00")
	out = section(out, 1, types)
	out = section(out, 2, imports)
	return section(out, 7, exports)
}

// fuzzReader takes bytes from the front of a program; past its end it
// gives zeros.
type fuzzReader []byte

func (r *fuzzReader) byte() byte {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return b
}

// operand decodes one operand: a selector byte, then what it needs. The
// selectors aim at the edges: zero, small numbers, offsets the kernel
// returned, the input, the end of kernel memory, the limits, and numbers
// that wrap around 2^64.
func (r *fuzzReader) operand(k *kernel, offs []uint64) uint64 {
	small := func() uint64 { return uint64(r.byte()) }
	switch r.byte() % 10 {
	case 0:
		return 0
	case 1:
		return small()
	case 2:
		if len(offs) == 0 {
			return blockAlign
		}
		return offs[int(r.byte())%len(offs)]
	case 3:
		if len(offs) == 0 {
			return blockAlign + small()
		}
		return offs[int(r.byte())%len(offs)] + small()
	case 4:
		return -small() // wraps: 2^64 - n
	case 5:
		var b [8]byte
		for i := range b {
			b[i] = r.byte()
		}
		return binary.LittleEndian.Uint64(b[:])
	case 6:
		return k.inputOff + small()
	case 7:
		return uint64(len(k.mem)) - small()
	case 8:
		return k.limit - 64 + small()
	default:
		return k.inputLen - 4 + small()%8
	}
}

// FuzzKernel drives the Extism kernel's host functions with random
// sequences of calls and operands, through wazero as a guest reaches them,
// with random input; then, unless a call trapped, it reads the output and
// the error message as Instance.Call does once the guest returns.
//
// Every host function must either work or trap with a *HostCallError (the
// documented trap path); a Go runtime error, which wazero recovers and
// turns into a trap, means the host failed, and a panic after the guest
// returns crashes the whole host. alloc must give a block of the size
// asked for, inside kernel memory, or trap.
func FuzzKernel(f *testing.F) {
	ops := fuzzOps(f)
	index := map[string]byte{}
	for i, op := range ops {
		index[op.name] = byte(i)
	}
	op := func(name string) byte { return index[abi.EnvModule+"."+name] }
	user := func(name string) byte { return index[abi.UserModule+"."+name] }
	// Seeds: a PDK's ordinary traffic (alloc, store, output_set; input
	// reads; error_set and return), and host-function input.
	f.Add([]byte(`{"params":{"name":"x"}}`), []byte{
		op(abi.FuncAlloc), 1, 16, op(abi.FuncStoreU64), 2, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8,
		op(abi.FuncOutputSet), 2, 0, 1, 16,
	})
	f.Add([]byte("hello, world"), []byte{
		op(abi.FuncInputLength), op(abi.FuncInputLoadU64), 1, 0, op(abi.FuncInputLoadU8), 9, 0,
		op(abi.FuncAlloc), 1, 5, op(abi.FuncErrorSet), 2, 0, op(abi.FuncLength), 2, 0,
	})
	f.Add([]byte(`{"progress":1}`), []byte{
		user(abi.FuncNotifyProgress), 6, 0, op(abi.FuncVarSet), 6, 0, 6, 0, op(abi.FuncVarGet), 6, 0,
		op(abi.FuncFree), 6, 0, op(abi.FuncReset), op(abi.FuncMemoryBytes),
	})
	f.Add([]byte{}, []byte{op(abi.FuncAlloc), 8, 0, op(abi.FuncAlloc), 8, 70, op(abi.FuncLoadU8), 7, 1})

	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, input, program []byte) {
		inst := &Instance{
			kernel: kernel{
				mem:       make([]byte, blockAlign, 256),
				limit:     1 << 16, // small, so that programs reach it
				maxOutput: 1 << 12,
				config:    map[string]string{"key": "value"},
			},
			log: log,
		}
		inst.host = func(_ context.Context, name string, in []byte) ([]byte, error) {
			if !json.Valid(in) {
				return nil, fmt.Errorf("input is not the expected JSON")
			}
			return []byte(`{"action":"cancel"}`), nil
		}
		k := &inst.kernel
		if err := k.reset(input); err != nil {
			return // refused before the guest runs
		}
		ctx := context.WithValue(context.Background(), instanceKey{}, inst)
		r := fuzzReader(program)
		var offs []uint64
		for len(r) > 0 {
			o := ops[int(r.byte())%len(ops)]
			args := make([]uint64, o.params)
			for i := range args {
				args[i] = r.operand(k, offs)
			}
			res, err := o.fn.Call(ctx, args...)
			if err != nil {
				var hce *HostCallError
				if !errors.As(err, &hce) {
					t.Fatalf("%s(%v) failed outside the documented trap path: %v", o.name, args, firstLineOf(err))
				}
				return // the guest traps, and the instance is closed
			}
			if o.name == abi.EnvModule+"."+abi.FuncAlloc && args[0] != 0 {
				off := res[0]
				if n := k.length(off); n != args[0] || off+n > uint64(len(k.mem)) || off+n < off {
					t.Fatalf("alloc(%d) gave a block at %d of length %d in %d bytes of kernel memory", args[0], off, n, len(k.mem))
				}
			}
			if len(res) == 1 && res[0] != 0 && len(offs) < 64 {
				offs = append(offs, res[0])
			}
		}
		// The guest returns: Instance.Call reads its output and, for a
		// non-zero return, its error message, outside wazero.
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("reading the output or error message after the guest returned panicked (this crashes the host): %v", p)
			}
		}()
		k.output()
		k.errorMessage()
	})
}

func firstLineOf(err error) string {
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}
