// Package rawkernel is the least Extism kernel that runs the test and
// benchmark plugins on plain wazero: the floor the benchmarks measure
// wasmtools' sandbox against (sandbox's raw-wazero benchmarks, package
// bench's raw-wazero baselines and raw-wazero-tool). Its functions are
// closures over one byte slice per kernel, with no checks beyond Go's
// bounds, no limits and no deadline: a guest's bad offset panics its
// caller, so it is for the project's own plugins only, never a guest
// from elsewhere.
package rawkernel

import (
	"context"
	"encoding/binary"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Kernel is the kernel memory of one call at a time: the blocks the guest
// allocates, its input and its output.
type Kernel struct {
	mem        []byte
	input      []byte
	outOff     uint64
	outLen     uint64
	errOff     uint64 // the block error_set named, 0 for none
	blockStart []uint64
}

// New returns an empty kernel.
func New() *Kernel { return &Kernel{mem: make([]byte, 8, 1024)} }

// Reset empties k for a call whose input is input.
func (k *Kernel) Reset(input []byte) {
	k.mem = k.mem[:8]
	k.blockStart = k.blockStart[:0]
	k.input = input
	k.outOff, k.outLen, k.errOff = 0, 0, 0
}

// Output is the output the guest set, in k's memory until the next Reset.
func (k *Kernel) Output() []byte { return k.mem[k.outOff : k.outOff+k.outLen] }

// Error is the message the guest set with error_set, in k's memory until
// the next Reset; empty if it set none.
func (k *Kernel) Error() []byte { return k.mem[k.errOff : k.errOff+k.length(k.errOff)] }

func (k *Kernel) alloc(n uint64) uint64 {
	off := uint64(len(k.mem))
	k.mem = append(k.mem, make([]byte, n)...)
	k.blockStart = append(k.blockStart, off)
	return off
}

func (k *Kernel) length(off uint64) uint64 {
	for i, st := range k.blockStart {
		if st == off {
			end := uint64(len(k.mem))
			if i+1 < len(k.blockStart) {
				end = k.blockStart[i+1]
			}
			return end - st
		}
	}
	return 0
}

// Define instantiates the kernel's module, extism:host/env, in rt. Each of
// its functions serves of(ctx), the kernel of the call whose context is
// ctx.
func Define(ctx context.Context, rt wazero.Runtime, of func(context.Context) *Kernel) error {
	i64, i32 := api.ValueTypeI64, api.ValueTypeI32
	bld := rt.NewHostModuleBuilder("extism:host/env")
	fn := func(name string, params, results []api.ValueType, f func(k *Kernel, s []uint64)) {
		bld.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, s []uint64) { f(of(ctx), s) }), params, results).Export(name)
	}
	fn("alloc", []api.ValueType{i64}, []api.ValueType{i64}, func(k *Kernel, s []uint64) { s[0] = k.alloc(s[0]) })
	fn("free", []api.ValueType{i64}, nil, func(*Kernel, []uint64) {})
	fn("length", []api.ValueType{i64}, []api.ValueType{i64}, func(k *Kernel, s []uint64) { s[0] = k.length(s[0]) })
	fn("load_u8", []api.ValueType{i64}, []api.ValueType{i32}, func(k *Kernel, s []uint64) { s[0] = uint64(k.mem[s[0]]) })
	fn("load_u64", []api.ValueType{i64}, []api.ValueType{i64}, func(k *Kernel, s []uint64) { s[0] = binary.LittleEndian.Uint64(k.mem[s[0]:]) })
	fn("store_u8", []api.ValueType{i64, i32}, nil, func(k *Kernel, s []uint64) { k.mem[s[0]] = byte(s[1]) })
	fn("store_u64", []api.ValueType{i64, i64}, nil, func(k *Kernel, s []uint64) { binary.LittleEndian.PutUint64(k.mem[s[0]:], s[1]) })
	fn("input_length", nil, []api.ValueType{i64}, func(k *Kernel, s []uint64) { s[0] = uint64(len(k.input)) })
	fn("input_load_u8", []api.ValueType{i64}, []api.ValueType{i32}, func(k *Kernel, s []uint64) { s[0] = uint64(k.input[s[0]]) })
	fn("input_load_u64", []api.ValueType{i64}, []api.ValueType{i64}, func(k *Kernel, s []uint64) { s[0] = binary.LittleEndian.Uint64(k.input[s[0]:]) })
	fn("output_set", []api.ValueType{i64, i64}, nil, func(k *Kernel, s []uint64) { k.outOff, k.outLen = s[0], s[1] })
	fn("error_set", []api.ValueType{i64}, nil, func(k *Kernel, s []uint64) { k.errOff = s[0] })
	fn("config_get", []api.ValueType{i64}, []api.ValueType{i64}, func(_ *Kernel, s []uint64) { s[0] = 0 })
	fn("var_get", []api.ValueType{i64}, []api.ValueType{i64}, func(_ *Kernel, s []uint64) { s[0] = 0 })
	fn("var_set", []api.ValueType{i64, i64}, nil, func(*Kernel, []uint64) {})
	_, err := bld.Instantiate(ctx)
	return err
}
