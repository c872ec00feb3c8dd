package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// wat assembles a WebAssembly-text module with wat2wasm (Debian package
// wabt, installed by scripts/deps.sh). Without it the test is skipped, or
// fails under CI=1.
func wat(t *testing.T, src string) []byte {
	t.Helper()
	bin, err := exec.LookPath("wat2wasm")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("wat2wasm not found: scripts/deps.sh installs it (Debian package wabt)")
		}
		t.Skip("wat2wasm not found: apt-get install wabt")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "m.wat"), filepath.Join(dir, "m.wasm")
	if err := os.WriteFile(in, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(bin, in, "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm: %v: %s", err, b)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// spinners are guests that never end, one for each shape the
// interruption must reach: each export "run" spins until stopped.
var spinners = []struct {
	name, body string
	// loopless: no loop spins, so wazero's own check, at loop headers
	// only, does not stop it.
	loopless bool
}{
	{"tight_loop", `(func (export "run") (result i32) (loop $l (br $l)) (i32.const 0))`, false},
	{"no_memory", `(func (export "run") (result i32) (loop $l (br $l)) (i32.const 0))`, false},
	{"br_if_back_edge", `(func (export "run") (result i32) (local $i i32)
		(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.const 1)))
		(local.get $i))`, false},
	{"br_table_dispatch", `(func (export "run") (result i32) (local $state i32)
		(loop $top
			(block $c2 (block $c1 (block $c0
				(br_table $c0 $c1 $c2 $top (local.get $state)))
				(local.set $state (i32.const 1)) (br $top))
				(local.set $state (i32.const 2)) (br $top))
			(local.set $state (i32.const 0)) (br $top))
		(i32.const 0))`, false},
	{"loop_in_else", `(func (export "run") (result i32)
		(if (result i32) (i32.eqz (i32.const 1))
			(then (i32.const 1))
			(else (loop $l (br $l)) (i32.const 2))))`, false},
	{"loop_with_params", `(type $p (func (param i32 i64) (result i32 i64)))
		(func (export "run") (result i32)
		(i32.const 1) (i64.const 2)
		(loop $l (type $p) (i64.add (i64.const 1)) (br $l))
		(drop))`, false},
	{"back_edge_from_nested_blocks", `(func (export "run") (result i32) (local $i i32)
		(loop $l
			(block $a (result i32)
				(block $b (result i32)
					(local.set $i (i32.add (local.get $i) (i32.const 3)))
					(br $l)))
			(drop))
		(i32.const 0))`, false},
	{"recursion_without_loops", `(func $fib (param $n i64) (result i64)
			(if (result i64) (i64.lt_u (local.get $n) (i64.const 2))
				(then (local.get $n))
				(else (i64.add (call $fib (i64.sub (local.get $n) (i64.const 1)))
					(call $fib (i64.sub (local.get $n) (i64.const 2)))))))
		(func (export "run") (result i32) (i32.wrap_i64 (call $fib (i64.const 90))))`, true},
	{"recursion_through_a_table", `(type $t (func (param i32) (result i32)))
		(table 2 funcref) (elem (i32.const 0) $f $g)
		(func $f (param $n i32) (result i32)
			(if (result i32) (i32.eqz (local.get $n)) (then (i32.const 0))
				(else (i32.add
					(call_indirect (type $t) (i32.sub (local.get $n) (i32.const 1)) (i32.const 1))
					(call_indirect (type $t) (i32.sub (local.get $n) (i32.const 1)) (i32.const 1))))))
		(func $g (param $n i32) (result i32) (call $f (local.get $n)))
		(func (export "run") (result i32) (call $f (i32.const 60)))`, true},
	{"between_host_calls", `(import "extism:host/env" "input_length" (func $len (result i64)))
		(func (export "run") (result i32) (local $n i64)
		(loop $l (local.set $n (i64.add (local.get $n) (call $len))) (br $l))
		(i32.const 0))`, false},
}

func spinnerModule(body string) string {
	return `(module ` + body + ` (memory (export "memory") 1))`
}

// TestInterruptStopsSpinners runs each spinner under a deadline and under
// a cancellation, with the host's flag and with wazero's own check: each
// must stop, with the context's error, and leave its instance closed.
func TestInterruptStopsSpinners(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		opt  sandbox.Interruption
	}{{"flag", sandbox.InterruptFlag}, {"wazero", sandbox.InterruptWazero}} {
		rt, err := sandbox.NewRuntime(sandbox.Options{Interruption: mode.opt})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close(ctx) })
		for _, s := range spinners {
			t.Run(mode.name+"/"+s.name, func(t *testing.T) {
				if s.loopless && mode.opt == sandbox.InterruptWazero {
					t.Skip("wazero checks loop headers only")
				}
				src := spinnerModule(s.body)
				if s.name == "no_memory" {
					src = "(module " + s.body + ")"
				}
				for _, stop := range []struct {
					name    string
					timeout time.Duration
					ctx     func() (context.Context, context.CancelFunc)
					want    error
				}{
					{"deadline", 200 * time.Millisecond, func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }, context.DeadlineExceeded},
					// The cancel case's deadline is far: on a loaded machine
					// the cancel must still come first.
					{"cancel", time.Minute, func() (context.Context, context.CancelFunc) {
						cctx, cancel := context.WithCancel(ctx)
						time.AfterFunc(50*time.Millisecond, cancel)
						return cctx, cancel
					}, context.Canceled},
				} {
					c, err := rt.Compile(ctx, wat(t, src), sandbox.NewPolicy().WithCallTimeout(stop.timeout))
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close(ctx)
					inst, err := c.Instantiate(ctx)
					if err != nil {
						t.Fatal(err)
					}
					cctx, cancel := stop.ctx()
					start := time.Now()
					_, err = inst.Call(cctx, "run", nil, nil)
					cancel()
					var te *sandbox.TrapError
					if !errors.Is(err, stop.want) || !errors.As(err, &te) {
						t.Fatalf("%s: err = %v after %v; want a TrapError matching %v", stop.name, err, time.Since(start), stop.want)
					}
					if inst.Err() == nil {
						t.Errorf("%s: the instance is still usable", stop.name)
					}
					if _, err := inst.Call(ctx, "run", nil, nil); !errors.Is(err, sandbox.ErrClosed) {
						t.Errorf("%s: a call after the stop: %v; want ErrClosed", stop.name, err)
					}
					inst.Close(ctx)
				}
			})
		}
	}
}

// TestInterruptStopsInitialisation stops a guest spinning in its start
// function and one spinning in _initialize: both fail Instantiate with
// the deadline's error.
func TestInterruptStopsInitialisation(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	for _, tt := range []struct{ name, src, where string }{
		{"start", `(module (memory (export "memory") 1) (func $spin (loop $l (br $l))) (start $spin)
			(func (export "call") (result i32) (i32.const 0)))`, "start function"},
		{"start_exported", `(module (memory (export "memory") 1) (func $spin (export "spin") (loop $l (br $l))) (start $spin)
			(func (export "call") (result i32) (i32.const 0)))`, "start function"},
		{"initialize", `(module (memory (export "memory") 1) (func (export "_initialize") (loop $l (br $l)))
			(func (export "call") (result i32) (i32.const 0)))`, "_initialize"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := rt.Compile(ctx, wat(t, tt.src), sandbox.NewPolicy().WithCallTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			for _, e := range c.Exports() {
				if strings.HasPrefix(e.Name, "wasmtools.") {
					t.Errorf("the host's own export %q is listed", e.Name)
				}
			}
			inst, err := c.Instantiate(ctx)
			if err == nil {
				inst.Close(ctx)
				t.Fatal("instantiated; want the deadline to stop it")
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tt.where) {
				t.Fatalf("err = %v; want one matching context.DeadlineExceeded naming %s", err, tt.where)
			}
		})
	}
}

// TestInterruptStartRuns checks that a start function still runs once per
// instance, before any export, now that the host calls it.
func TestInterruptStartRuns(t *testing.T) {
	ctx := context.Background()
	src := `(module (memory (export "memory") 1) (global $g (mut i32) (i32.const 0))
		(func $start (global.set $g (i32.add (global.get $g) (i32.const 41))))
		(start $start)
		(func (export "run") (result i32) (i32.sub (global.get $g) (i32.const 41))))`
	c, err := newRuntime(t).Compile(ctx, wat(t, src), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	inst := instantiate(t, c)
	if _, err := inst.Call(ctx, "run", nil, nil); err != nil {
		t.Fatalf("run: %v; want 0 (the start function ran once)", err)
	}
	if _, err := inst.Call(ctx, "wasmtools.start", nil, nil); !errors.Is(err, sandbox.ErrNoExport) {
		t.Errorf("calling the host's start export: %v; want ErrNoExport", err)
	}
}

// TestInterruptRefusesReservedNames refuses a guest exporting a name the
// instrumentation adds.
func TestInterruptRefusesReservedNames(t *testing.T) {
	ctx := context.Background()
	for _, src := range []string{
		`(module (global (export "wasmtools.interrupt") (mut i32) (i32.const 0)))`,
		`(module (func (export "wasmtools.start")))`,
	} {
		c, err := newRuntime(t).Compile(ctx, wat(t, src), sandbox.NewPolicy())
		if err == nil {
			c.Close(ctx)
			t.Fatalf("%s compiled; want it refused", src)
		}
		if !strings.Contains(err.Error(), "keeps for its own use") {
			t.Errorf("err = %v; want it to name the reserved export", err)
		}
	}
}

// TestInterruptLateCancel cancels calls at random moments around their
// end: a call that returned must leave the instance usable, with its flag
// clear, however close the cancellation came.
func TestInterruptLateCancel(t *testing.T) {
	ctx := context.Background()
	c := compileCounter(t, 100000)
	inst := instantiate(t, c)
	var stopped, finished int
	for range 300 {
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(time.Duration(rand.IntN(150))*time.Microsecond, cancel)
		_, err := inst.Call(cctx, "run", nil, nil)
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v; want context.Canceled", err)
			}
			stopped++
			inst = instantiate(t, c)
			continue
		}
		finished++
		if _, err := inst.Call(ctx, "run", nil, nil); err != nil {
			t.Fatalf("the call after one that finished: %v", err)
		}
	}
	t.Logf("%d calls stopped, %d finished", stopped, finished)
}

// TestInterruptDuringGC collects garbage over and over while a guest
// spins: native code cannot be preempted, so a guest that never went back
// to Go would hold up every stop-the-world, and with it the timer that is
// to stop it. Each collection must end, and the deadline must still stop
// the guest.
func TestInterruptDuringGC(t *testing.T) {
	ctx := context.Background()
	for _, s := range spinners {
		t.Run(s.name, func(t *testing.T) {
			src := spinnerModule(s.body)
			if s.name == "no_memory" {
				src = "(module " + s.body + ")"
			}
			c, err := newRuntime(t).Compile(ctx, wat(t, src), sandbox.NewPolicy().WithCallTimeout(300*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			inst := instantiate(t, c)
			most, err := callDuringGC(inst)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v; want context.DeadlineExceeded", err)
			}
			if most > 2*time.Second {
				t.Errorf("a collection took %v while the guest ran", most)
			}
		})
	}
}

// TestInterruptLongLoopBody runs, while garbage is collected back to back,
// a loop whose body is half a megabyte of straight-line code: the budget
// is charged in bytes of code, so the guest still goes to Go (where a
// collection can stop it) every few iterations, not every few thousand.
func TestInterruptLongLoopBody(t *testing.T) {
	ctx := context.Background()
	unit := []byte{0x41, 0x00, 0x41, 0x00, 0x28, 0x02, 0x00, 0x41, 0x01, 0x6a, 0x36, 0x02, 0x00} // mem[0]++
	body := []byte{0x00, 0x03, 0x40}                                                             // no locals; loop
	body = append(body, bytes.Repeat(unit, 40_000)...)
	body = append(body, 0x0c, 0x00, 0x0b, 0x0b) // br 0, end loop, end
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = testplugins.Section(m, 1, []byte{1, 0x60, 0, 0})
	m = testplugins.Section(m, 3, []byte{1, 0})
	m = testplugins.Section(m, 5, []byte{1, 0, 1})
	m = testplugins.Section(m, 7, []byte{2, 3, 'r', 'u', 'n', 0, 0, 6, 'm', 'e', 'm', 'o', 'r', 'y', 2, 0})
	m = testplugins.Section(m, 10, append(testplugins.ULEB([]byte{1}, uint64(len(body))), body...))
	c, err := newRuntime(t).Compile(ctx, m, sandbox.NewPolicy().WithCallTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	inst := instantiate(t, c)
	most, err := callDuringGC(inst)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want context.DeadlineExceeded", err)
	}
	t.Logf("the longest collection took %v", most)
	if most > time.Second {
		t.Errorf("a collection took %v while the guest ran", most)
	}
}

// callDuringGC calls inst's export "run" while garbage is collected back
// to back, and returns the longest collection and the call's error.
func callDuringGC(inst *sandbox.Instance) (time.Duration, error) {
	done := make(chan struct{})
	longest := make(chan time.Duration, 1)
	go func() {
		var most time.Duration
		for {
			select {
			case <-done:
				longest <- most
				return
			default:
			}
			start := time.Now()
			runtime.GC()
			most = max(most, time.Since(start))
		}
	}()
	_, err := inst.Call(context.Background(), "run", nil, nil)
	close(done)
	return <-longest, err
}

// TestWarmCallAllocates pins what a warm call allocates around its guest
// (issue 27, item 2): the call's cancellable context and the value that
// finds the instance in it; with a caller's context that can end, the one
// AfterFunc by which its end sets the interrupt flag. The deadline's timer
// is the instance's, and its firing, Close and the caller's end set the
// flag themselves, with no AfterFunc on the call's own context.
func TestWarmCallAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	inst := instantiate(t, compileCounter(t, 100))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, p := range []struct {
		name string
		ctx  context.Context
		want float64
	}{{"background", ctx, 4}, {"cancellable", cctx, 6}} {
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := inst.Call(p.ctx, "run", nil, nil); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > p.want {
			t.Errorf("a warm call with a %s context: %v allocations; want %v", p.name, allocs, p.want)
		}
		t.Logf("%s: %v", p.name, allocs)
	}
}

// compileCounter compiles a module whose export "run" counts to n.
func compileCounter(t *testing.T, n int) *sandbox.Compiled {
	t.Helper()
	src := spinnerModule(`(func (export "run") (result i32) (local $i i32)
		(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1)))
			(br_if $l (i32.lt_u (local.get $i) (i32.const ` + strconv.Itoa(n) + `))))
		(i32.const 0))`)
	ctx := context.Background()
	c, err := newRuntime(t).Compile(ctx, wat(t, src), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx) })
	return c
}

// TestEndedContextRunsNoGuest: a call whose context has ended before it
// begins is interrupted at the guest's first check. It was interrupted
// once context.AfterFunc's goroutine ran, which a loaded machine runs
// late, so that a short guest (the servlet's echo, a start function)
// often ran to its end: a lease whose client had gone started its
// instance all the same (internal/sessions' TestFailedStartAsksStoredAgain
// failed so under -race, about once in 30).
func TestEndedContextRunsNoGuest(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	c, err := rt.Compile(ctx, testplugins.Bytes(t, testplugins.Test(t, "servlet")), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	input := []byte(`{"params":{"name":"echo","arguments":{"text":"x"}}}`)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	ran := 0
	for range 100 {
		inst, err := c.Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inst.Call(ended, "call", input, nil); err == nil {
			ran++
		} else if !errors.Is(err, context.Canceled) {
			t.Fatalf("a call under an ended context: %v; want it cancelled", err)
		}
		inst.Close(ctx)
	}
	if ran > 0 {
		t.Errorf("%d calls of 100 under an ended context ran to their end; want none", ran)
	}
}
