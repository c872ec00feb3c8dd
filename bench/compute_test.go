package bench

import (
	"context"
	"runtime/metrics"
	"strconv"
	"syscall"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// computeN is the size of the compute benchmark's work: records built,
// counted, encoded, decoded, sorted and hashed per call (tens of
// milliseconds of guest time on one core). -short makes it smaller.
const computeN = 1000

// BenchmarkComputeCall measures a compute-heavy Go plugin (issue 27): the
// test plugin compute, ordinary Go built with the standard toolchain and
// the Extism Go PDK, whose tool crunch spends its call in the guest
// (maps, JSON, sorting, SHA-256). Each contender runs the same module,
// warm, one call after another, and must return the same text:
//
//   - raw-wazero: plain wazero with no termination check (no deadline can
//     stop the guest) and the least Extism kernel: the floor.
//   - raw-wazero-check: the same with wazero's own termination check
//     (WithCloseOnContextDone), what wasmtools used before issue 27.
//   - sandbox: wasmtools' sandbox, the module instrumented with the
//     host's interrupt flag (sandbox.InterruptFlag), under a deadline.
//   - sandbox-wazero-check: the sandbox with wazero's check instead
//     (sandbox.InterruptWazero).
//   - wasmtools: the full MCP stack in memory (go-sdk client and server,
//     host, sandbox), as a client sees it.
//
// Besides ns/op, each reports cpu-ns/op, the CPU time the whole process
// spent per call (user and system, every thread: the guest, the host, the
// garbage collector): on a shared machine, wall time counts the other
// processes' turns, CPU time far less. Issue 27's goal: wasmtools at most
// 1.3 times raw-wazero's time.
func BenchmarkComputeCall(b *testing.B) {
	ctx := context.Background()
	n := computeN
	if testing.Short() {
		n = 50
	}
	path := testplugins.Test(b, "compute")
	wasm := testplugins.Bytes(b, path)
	args := map[string]any{"n": n}
	input := []byte(`{"params":{"name":"crunch","arguments":{"n":` + strconv.Itoa(n) + `}}}`)
	var want string // the first contender's answer, which all must give

	check := func(b *testing.B, out []byte, err error) {
		if err != nil {
			b.Fatal(err)
		}
		got, err := resultText(out)
		if err != nil {
			b.Fatal(err)
		}
		agree(b, &want, got)
	}
	raw := func(cfg wazero.RuntimeConfig) func(b *testing.B) {
		return func(b *testing.B) {
			r := newRawRuntimeWith(ctx, b, wasm, cfg)
			m, err := r.instantiate(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close(ctx)
			f := m.ExportedFunction("call")
			out, err := r.callOn(ctx, r.k, f, r.stack[:], input)
			check(b, out, err)
			cpu := startCPU()
			for b.Loop() {
				out, err = r.callOn(ctx, r.k, f, r.stack[:], input)
			}
			cpu.report(b)
			check(b, out, err)
		}
	}
	box := func(opts sandbox.Options) func(b *testing.B) {
		return func(b *testing.B) {
			inst, err := newSandboxWith(ctx, b, wasm, opts).Instantiate(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Close(ctx)
			out, err := inst.Call(ctx, "call", input, nil)
			check(b, out, err)
			cpu := startCPU()
			for b.Loop() {
				out, err = inst.Call(ctx, "call", input, nil)
			}
			cpu.report(b)
			check(b, out, err)
		}
	}
	b.Run("raw-wazero", raw(wazero.NewRuntimeConfig()))
	b.Run("raw-wazero-check", raw(wazero.NewRuntimeConfig().WithCloseOnContextDone(true)))
	b.Run("sandbox", box(sandbox.Options{}))
	b.Run("sandbox-wazero-check", box(sandbox.Options{Interruption: sandbox.InterruptWazero}))
	b.Run("wasmtools", func(b *testing.B) {
		h := newHost(b, path)
		cs, _, err := connectInMemory(ctx, h.Server())
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		got, err := callText(ctx, cs, "crunch", args)
		if err != nil {
			b.Fatal(err)
		}
		agree(b, &want, got)
		cpu := startCPU()
		for b.Loop() {
			got, err = callText(ctx, cs, "crunch", args)
		}
		cpu.report(b)
		if err != nil {
			b.Fatal(err)
		}
		agree(b, &want, got)
	})
}

// cpuClock is the process's CPU time, page faults and garbage
// collections at the start of a timed loop.
type cpuClock struct{ cpu, faults, gcs int64 }

// processUsage returns this process's CPU time (user and system) and its
// page faults that allocated no I/O (minor: a page first written, or
// copied on write), from getrusage, and the collections it has made.
func processUsage() cpuClock {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(gc)
	return cpuClock{ru.Utime.Nano() + ru.Stime.Nano(), ru.Minflt, int64(gc[0].Value.Uint64())}
}

func startCPU() cpuClock { return processUsage() }

// report reports the CPU time per iteration since c, as cpu-ns/op; the
// page faults, as faults/op; the garbage collections, as gcs/op; and the
// live heap the process's last collection found, as heap-live-MiB (a
// collection before the timed calls, if none ran during them). A fault
// costs 14 to 20 µs in the VMs measured here (a Go guest's heap taking
// pages it never touched before is a fault for each 4 KiB), so a contender
// can spend much of its CPU time in them. The collector runs once the heap
// has grown by roughly as much as it held live at the last collection
// (GOGC=100), so the whole process's live heap sets how often every
// contender's garbage is collected (docs/DESIGN.md, "The collector in the
// benchmarks").
func (c cpuClock) report(b *testing.B) {
	now := processUsage()
	b.ReportMetric(float64(now.cpu-c.cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(now.faults-c.faults)/float64(b.N), "faults/op")
	b.ReportMetric(float64(now.gcs-c.gcs)/float64(b.N), "gcs/op")
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	b.ReportMetric(float64(live[0].Value.Uint64())/(1<<20), "heap-live-MiB")
}

// agree sets *want to got the first time, and fails b when a later got
// differs.
func agree(b *testing.B, want *string, got string) {
	b.Helper()
	if *want == "" {
		*want = got
		return
	}
	if got != *want {
		b.Fatalf("answered %q; the first contender answered %q", got, *want)
	}
}
