package sandbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sort"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmtools/wasmtools/abi"
)

// kernel is the host side of the Extism kernel (module extism:host/env) for
// one instance, served natively in Go.
//
// Extism's own SDK runs its kernel as a second Wasm module and enters it
// through a freshly built wazero function object on every kernel call; here
// the memory blocks live in one Go byte slice, so a kernel call is a bounds
// check and a copy. See docs/DESIGN.md, "Why a native kernel".
//
// Offsets are indexes into mem. Offset 0 is never a block: it means "none".
// Blocks are allocated by bumping, and the whole arena is reset before each
// export call, as Extism resets its kernel memory before each call. Vars
// outlive calls.
type kernel struct {
	mem    []byte  // the arena; mem[0:blockAlign] is never allocated
	blocks []block // sorted by offset
	limit  uint64  // the most mem may hold

	inputOff, inputLen   uint64
	outputOff, outputLen uint64
	outputSet            bool
	errorOff             uint64

	maxOutput uint64
	config    map[string]string

	httpStatus  int
	httpHeaders []byte
	vars        map[string][]byte
	varBytes    uint64
}

type block struct {
	off, len uint64
	free     bool
}

const (
	blockAlign = 8
	// maxVarBytes bounds what an instance's vars cost the host, counted
	// by varCost.
	maxVarBytes = 1 << 20
	// maxVars bounds how many vars an instance holds.
	maxVars = 4096
	// varOverhead is what one var costs the host besides its key and
	// value bytes: its map slot (a string and a slice header, with the
	// map's spare capacity) and the rounding of its two allocations.
	// Measured (TestVarOverhead, Go 1.26, amd64): 63 to 109 bytes for
	// 1 000 to 100 000 vars of a 4-byte key and a 1-byte value, the most
	// just after the map grows.
	varOverhead = 120
)

// varCost is what a var of key and value bytes costs the host.
func varCost(key, value int) uint64 { return uint64(key) + uint64(value) + varOverhead }

// reset empties the arena and places input in it as the first block.
func (k *kernel) reset(input []byte) error {
	if uint64(len(input))+blockAlign > k.limit {
		return fmt.Errorf("input of %d bytes is over the %d-byte memory limit", len(input), k.limit)
	}
	k.mem = k.mem[:blockAlign]
	k.blocks = k.blocks[:0]
	k.outputOff, k.outputLen, k.outputSet, k.errorOff = 0, 0, false, 0
	k.inputLen = uint64(len(input))
	k.inputOff = 0
	if len(input) > 0 {
		k.inputOff = k.alloc(uint64(len(input)))
		copy(k.mem[k.inputOff:], input)
	}
	return nil
}

// alloc returns a new block of n bytes, or 0 when n is 0 or the arena is
// full (the caller decides whether that is a trap).
func (k *kernel) alloc(n uint64) uint64 {
	if n == 0 || n > k.limit {
		return 0
	}
	off := uint64(len(k.mem))
	end := off + n
	padded := (end + blockAlign - 1) &^ (blockAlign - 1)
	if padded > k.limit || padded < off {
		return 0
	}
	if uint64(cap(k.mem)) < padded {
		grown := make([]byte, padded, max(padded, uint64(cap(k.mem))*2))
		copy(grown, k.mem)
		k.mem = grown
	} else {
		k.mem = k.mem[:padded]
		clear(k.mem[off:padded])
	}
	k.blocks = append(k.blocks, block{off: off, len: n})
	return off
}

// find returns the index of the live block at off, or -1.
func (k *kernel) find(off uint64) int {
	i := sort.Search(len(k.blocks), func(i int) bool { return k.blocks[i].off >= off })
	if i < len(k.blocks) && k.blocks[i].off == off && !k.blocks[i].free {
		return i
	}
	return -1
}

func (k *kernel) length(off uint64) uint64 {
	if i := k.find(off); i >= 0 {
		return k.blocks[i].len
	}
	return 0
}

func (k *kernel) free(off uint64) {
	i := k.find(off)
	if i < 0 {
		return
	}
	if i == len(k.blocks)-1 { // the last block: give its bytes back
		k.mem = k.mem[:k.blocks[i].off]
		k.blocks = k.blocks[:i]
		return
	}
	k.blocks[i].free = true
}

// bytes returns the live block at off, or an error naming fn.
func (k *kernel) bytes(fn string, off uint64) ([]byte, error) {
	if off == 0 {
		return nil, nil
	}
	i := k.find(off)
	if i < 0 {
		return nil, &HostCallError{Func: fn, Reason: fmt.Sprintf("offset %d is not a live memory block", off)}
	}
	return k.mem[off : off+k.blocks[i].len], nil
}

// span checks that [off, off+n) lies in the arena.
func (k *kernel) span(fn string, off, n uint64) error {
	if off < blockAlign || off+n > uint64(len(k.mem)) || off+n < off {
		return &HostCallError{Func: fn, Reason: fmt.Sprintf("%d bytes at offset %d are outside Extism memory (%d bytes)", n, off, len(k.mem))}
	}
	return nil
}

// maxIdleArena is the most kernel memory an instance keeps between calls:
// a call that needed more gives it back when it ends, so an idle session
// does not hold its largest call's memory.
const maxIdleArena = 64 << 10

// shrink gives back a large arena once a call is over.
func (k *kernel) shrink() {
	if cap(k.mem) > maxIdleArena {
		k.mem = make([]byte, blockAlign, 256)
		k.blocks = nil
	}
}

// output returns the bytes the guest set with output_set.
func (k *kernel) output() []byte {
	if !k.outputSet || k.outputLen == 0 {
		return nil
	}
	out := make([]byte, k.outputLen)
	copy(out, k.mem[k.outputOff:k.outputOff+k.outputLen])
	return out
}

// errorMessage returns the message the guest set with error_set.
func (k *kernel) errorMessage() (string, bool) {
	if k.errorOff == 0 {
		return "", false
	}
	b, err := k.bytes(abi.FuncErrorSet, k.errorOff)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// writeBlock allocates a block holding b, trapping when the arena is full.
func (k *kernel) writeBlock(fn string, b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	off := k.alloc(uint64(len(b)))
	if off == 0 {
		panic(&HostCallError{Func: fn, Reason: fmt.Sprintf("Extism memory limit of %d bytes reached", k.limit)})
	}
	copy(k.mem[off:], b)
	return off
}

// setVar sets var key to val, deleting it when val is empty, and traps
// when the vars would cost more than maxVarBytes or number over maxVars.
func (k *kernel) setVar(key, val []byte) {
	old, had := k.vars[string(key)]
	if len(val) == 0 {
		if had {
			delete(k.vars, string(key))
			k.varBytes -= varCost(len(key), len(old))
		}
		return
	}
	size := k.varBytes + varCost(len(key), len(val))
	if had {
		size -= varCost(len(key), len(old))
	} else if len(k.vars) >= maxVars {
		trap(&HostCallError{Func: abi.FuncVarSet, Reason: fmt.Sprintf("vars would number %d, over the limit of %d", len(k.vars)+1, maxVars)})
	}
	if size > maxVarBytes {
		trap(&HostCallError{Func: abi.FuncVarSet, Reason: fmt.Sprintf("vars would hold %d bytes (keys and values, and %d bytes a var), over the %d-byte limit", size, varOverhead, maxVarBytes)})
	}
	if k.vars == nil {
		k.vars = map[string][]byte{}
	}
	k.vars[string(key)] = append([]byte(nil), val...)
	k.varBytes = size
}

// kernelOf returns the kernel of the instance whose call is on ctx.
func kernelOf(ctx context.Context) *kernel {
	return &ctx.Value(instanceKey{}).(*Instance).kernel
}

type instanceKey struct{}

// trap panics with err, which wazero turns into a trap of the guest.
func trap(err error) {
	panic(err)
}

// instantiateKernel defines module extism:host/env in rt.
func instantiateKernel(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(abi.EnvModule)
	i64, i32 := api.ValueTypeI64, api.ValueTypeI32
	def := func(name string, params, results []api.ValueType, f func(k *kernel, stack []uint64)) {
		b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, stack []uint64) {
			f(kernelOf(ctx), stack)
		}), params, results).WithName(name).Export(name)
	}
	p := func(ts ...api.ValueType) []api.ValueType { return ts }

	def(abi.FuncAlloc, p(i64), p(i64), func(k *kernel, s []uint64) {
		off := k.alloc(s[0])
		if off == 0 && s[0] != 0 {
			trap(&HostCallError{Func: abi.FuncAlloc, Reason: fmt.Sprintf("allocating %d bytes would pass the Extism memory limit of %d bytes", s[0], k.limit)})
		}
		s[0] = off
	})
	def(abi.FuncFree, p(i64), nil, func(k *kernel, s []uint64) { k.free(s[0]) })
	def(abi.FuncLength, p(i64), p(i64), func(k *kernel, s []uint64) { s[0] = k.length(s[0]) })
	def(abi.FuncLengthUnsafe, p(i64), p(i64), func(k *kernel, s []uint64) { s[0] = k.length(s[0]) })
	def(abi.FuncLoadU8, p(i64), p(i32), func(k *kernel, s []uint64) {
		if err := k.span(abi.FuncLoadU8, s[0], 1); err != nil {
			trap(err)
		}
		s[0] = uint64(k.mem[s[0]])
	})
	def(abi.FuncLoadU64, p(i64), p(i64), func(k *kernel, s []uint64) {
		if err := k.span(abi.FuncLoadU64, s[0], 8); err != nil {
			trap(err)
		}
		s[0] = binary.LittleEndian.Uint64(k.mem[s[0]:])
	})
	def(abi.FuncStoreU8, p(i64, i32), nil, func(k *kernel, s []uint64) {
		if err := k.span(abi.FuncStoreU8, s[0], 1); err != nil {
			trap(err)
		}
		k.mem[s[0]] = byte(s[1])
	})
	def(abi.FuncStoreU64, p(i64, i64), nil, func(k *kernel, s []uint64) {
		if err := k.span(abi.FuncStoreU64, s[0], 8); err != nil {
			trap(err)
		}
		binary.LittleEndian.PutUint64(k.mem[s[0]:], s[1])
	})
	def(abi.FuncInputLength, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.inputLen })
	def(abi.FuncInputOffset, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.inputOff })
	def(abi.FuncInputLoadU8, p(i64), p(i32), func(k *kernel, s []uint64) {
		if s[0] >= k.inputLen {
			trap(&HostCallError{Func: abi.FuncInputLoadU8, Reason: fmt.Sprintf("index %d is past the %d-byte input", s[0], k.inputLen)})
		}
		if err := k.span(abi.FuncInputLoadU8, k.inputOff+s[0], 1); err != nil {
			trap(&HostCallError{Func: abi.FuncInputLoadU8, Reason: "the input is no longer in Extism memory (freed, or memory reset)"})
		}
		s[0] = uint64(k.mem[k.inputOff+s[0]])
	})
	def(abi.FuncInputLoadU64, p(i64), p(i64), func(k *kernel, s []uint64) {
		if s[0]+8 > k.inputLen || s[0]+8 < s[0] {
			trap(&HostCallError{Func: abi.FuncInputLoadU64, Reason: fmt.Sprintf("8 bytes at index %d are past the %d-byte input", s[0], k.inputLen)})
		}
		if err := k.span(abi.FuncInputLoadU64, k.inputOff+s[0], 8); err != nil {
			trap(&HostCallError{Func: abi.FuncInputLoadU64, Reason: "the input is no longer in Extism memory (freed, or memory reset)"})
		}
		s[0] = binary.LittleEndian.Uint64(k.mem[k.inputOff+s[0]:])
	})
	def(abi.FuncInputSet, p(i64, i64), nil, func(k *kernel, s []uint64) {
		if err := k.span(abi.FuncInputSet, s[0], s[1]); err != nil {
			trap(err)
		}
		k.inputOff, k.inputLen = s[0], s[1]
	})
	def(abi.FuncOutputSet, p(i64, i64), nil, func(k *kernel, s []uint64) {
		if s[1] > k.maxOutput {
			trap(&HostCallError{Func: abi.FuncOutputSet, Reason: fmt.Sprintf("output of %d bytes is over the %d-byte limit", s[1], k.maxOutput)})
		}
		if s[1] > 0 {
			if err := k.span(abi.FuncOutputSet, s[0], s[1]); err != nil {
				trap(err)
			}
		}
		k.outputOff, k.outputLen, k.outputSet = s[0], s[1], true
	})
	def(abi.FuncOutputLength, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.outputLen })
	def(abi.FuncOutputOffset, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.outputOff })
	def(abi.FuncErrorSet, p(i64), nil, func(k *kernel, s []uint64) {
		if s[0] != 0 && k.find(s[0]) < 0 {
			trap(&HostCallError{Func: abi.FuncErrorSet, Reason: fmt.Sprintf("offset %d is not a live memory block", s[0])})
		}
		k.errorOff = s[0]
	})
	def(abi.FuncErrorGet, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.errorOff })
	def(abi.FuncReset, nil, nil, func(k *kernel, s []uint64) {
		k.mem = k.mem[:blockAlign]
		k.blocks = k.blocks[:0]
		k.inputOff, k.inputLen, k.outputOff, k.outputLen, k.outputSet, k.errorOff = 0, 0, 0, 0, false, 0
	})
	def(abi.FuncMemoryBytes, nil, p(i64), func(k *kernel, s []uint64) { s[0] = uint64(len(k.mem)) })
	def(abi.FuncConfigGet, p(i64), p(i64), func(k *kernel, s []uint64) {
		key, err := k.bytes(abi.FuncConfigGet, s[0])
		if err != nil {
			trap(err)
		}
		v, ok := k.config[string(key)]
		if !ok {
			s[0] = 0
			return
		}
		s[0] = k.writeBlock(abi.FuncConfigGet, []byte(v))
	})
	def(abi.FuncVarGet, p(i64), p(i64), func(k *kernel, s []uint64) {
		key, err := k.bytes(abi.FuncVarGet, s[0])
		if err != nil {
			trap(err)
		}
		s[0] = k.writeBlock(abi.FuncVarGet, k.vars[string(key)])
	})
	def(abi.FuncVarSet, p(i64, i64), nil, func(k *kernel, s []uint64) {
		key, err := k.bytes(abi.FuncVarSet, s[0])
		if err != nil {
			trap(err)
		}
		val, err := k.bytes(abi.FuncVarSet, s[1])
		if err != nil {
			trap(err)
		}
		k.setVar(key, val)
	})
	// Network access comes with a grant of allowed hosts; without one, a
	// request fails naming what is missing, rather than the plugin failing
	// to load for importing the function.
	b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, s []uint64) {
		inst := ctx.Value(instanceKey{}).(*Instance)
		k := &inst.kernel
		k.httpStatus, k.httpHeaders = 0, nil
		req, err := k.bytes(abi.FuncHTTPRequest, s[0])
		if err != nil {
			trap(err)
		}
		body, err := k.bytes(abi.FuncHTTPRequest, s[1])
		if err != nil {
			trap(err)
		}
		out, err := inst.doHTTP(ctx, req, append([]byte(nil), body...))
		if err != nil {
			trap(&HostCallError{Func: abi.FuncHTTPRequest, Reason: err.Error(), Err: err})
		}
		s[0] = k.writeBlock(abi.FuncHTTPRequest, out)
	}), p(i64, i64), p(i64)).WithName(abi.FuncHTTPRequest).Export(abi.FuncHTTPRequest)
	def(abi.FuncHTTPStatus, nil, p(i32), func(k *kernel, s []uint64) { s[0] = uint64(k.httpStatus) })
	def(abi.FuncHTTPHeaders, nil, p(i64), func(k *kernel, s []uint64) { s[0] = k.writeBlock(abi.FuncHTTPHeaders, k.httpHeaders) })
	def(abi.FuncGetLogLevel, nil, p(i32), func(k *kernel, s []uint64) { s[0] = 0 }) // trace: the host filters
	for name, level := range map[string]slog.Level{
		abi.FuncLogTrace: slog.LevelDebug - 4, abi.FuncLogDebug: slog.LevelDebug,
		abi.FuncLogInfo: slog.LevelInfo, abi.FuncLogWarn: slog.LevelWarn, abi.FuncLogError: slog.LevelError,
	} {
		b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, s []uint64) {
			inst := ctx.Value(instanceKey{}).(*Instance)
			msg, err := inst.kernel.bytes(name, s[0])
			if err != nil {
				trap(err)
			}
			if len(msg) > maxLogLine {
				msg = msg[:maxLogLine]
			}
			inst.logGuest(ctx, level, msg)
		}), p(i64), nil).WithName(name).Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}
