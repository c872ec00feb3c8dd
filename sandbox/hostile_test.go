package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The hostile modules of project issue 12 that stalled loading, made here
// since they are large and regular. See docs/SECURITY.md.

// withTable returns a module with one funcref table of min entries (and
// max, when max >= 0) and nothing else.
func withTable(min, max int) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	t := []byte{1, 0x70}
	if max >= 0 {
		t = testplugins.ULEB(testplugins.ULEB(append(t, 1), uint64(min)), uint64(max))
	} else {
		t = testplugins.ULEB(append(t, 0), uint64(min))
	}
	return testplugins.Section(m, 4, t)
}

// withLocals returns a module whose one function declares n i32 locals.
func withLocals(n int) []byte {
	return testplugins.ModuleWithBody(append(testplugins.ULEB([]byte{1}, uint64(n)), 0x7f))
}

// manyFunctions returns a module of n functions () -> ().
func manyFunctions(n int) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = testplugins.Section(m, 1, []byte{1, 0x60, 0, 0})
	m = testplugins.Section(m, 3, append(testplugins.ULEB(nil, uint64(n)), bytes.Repeat([]byte{0}, n)...))
	m = testplugins.Section(m, 10, append(testplugins.ULEB(nil, uint64(n)), bytes.Repeat([]byte{2, 0, 0x0b}, n)...))
	return m
}

func TestHostileModuleLimits(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	// The baseline: compiling a small plugin, on this machine, now.
	start := time.Now()
	c, err := rt.Compile(ctx, testplugins.Bytes(t, testplugins.Example(t, "counter")), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	baseline := time.Since(start)

	tests := []struct {
		name  string
		wasm  []byte
		limit string
		value uint64
	}{
		{"50000_nested_loops", testplugins.ModuleWithBody(testplugins.NestedLoops(50_000)), "max_loops", 2049},
		{"100000_nested_blocks", testplugins.ModuleWithBody(testplugins.NestedBlocks(100_000)), "max_nesting", 2049},
		{"1000000_br_table_targets", testplugins.ModuleWithBody(testplugins.BrTable(1_000_000)), "max_br_table_targets", 1_000_000},
		{"40000_loops_100_deep", testplugins.ModuleWithBody(append([]byte{0}, bytes.Repeat(testplugins.NestedLoops(100)[1:], 400)...)), "max_loops", 2049},
		{"20000_blocks", testplugins.ModuleWithBody(append([]byte{0}, bytes.Repeat(testplugins.NestedBlocks(1000)[1:], 20)...)), "max_blocks", 8193},
		{"1000000_locals", withLocals(1_000_000), "max_locals", 1_000_000},
		{"table_min_2^26", withTable(1<<26, -1), "max_table_size", 1 << 26},
		{"300000_functions", manyFunctions(300_000), "max_functions", 200_001},
		{"2MiB_function", testplugins.ModuleWithBody(append([]byte{0}, bytes.Repeat([]byte{0x01}, 2<<20)...)), "max_function_size", 2<<20 + 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			c, err := rt.Compile(ctx, tt.wasm, sandbox.NewPolicy())
			took := time.Since(start)
			if err == nil {
				c.Close(ctx)
				t.Fatalf("compiled (in %v); want it refused over %s", took, tt.limit)
			}
			var le *sandbox.LimitError
			if !errors.As(err, &le) || le.Limit != tt.limit || le.Value != tt.value {
				t.Fatalf("error %q (%#v); want a LimitError over %s of %d", err, le, tt.limit, tt.value)
			}
			if !strings.Contains(err.Error(), tt.limit) || !strings.Contains(err.Error(), fmt.Sprint(tt.value)) {
				t.Errorf("error %q names neither the limit nor the value", err)
			}
			if bound := 10*baseline + 2*time.Second; took > bound {
				t.Errorf("refusing took %v, over %v (10 times compiling counter, plus 2 s)", took, bound)
			}
		})
	}
	t.Run("raised_limit", func(t *testing.T) {
		c, err := rt.Compile(ctx, withLocals(100_000), sandbox.NewPolicy().WithModuleLimits(sandbox.ModuleLimits{MaxLocals: 100_000}))
		if err != nil {
			t.Fatalf("a module within a raised limit: %v", err)
		}
		c.Close(ctx)
	})
}

// TestHostileCompileDeadline compiles a module within every limit that
// takes long to compile: each of its functions has 2 000 loops.
func TestHostileCompileDeadline(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	body := append([]byte{0}, bytes.Repeat(testplugins.NestedLoops(100)[1:], 20)...)
	slow := func(n int) []byte {
		m := []byte("\x00asm\x01\x00\x00\x00")
		m = testplugins.Section(m, 1, []byte{1, 0x60, 0, 0})
		m = testplugins.Section(m, 3, append(testplugins.ULEB(nil, uint64(n)), bytes.Repeat([]byte{0}, n)...))
		fn := append(testplugins.ULEB(nil, uint64(len(body)+1)), append(body, 0x0b)...)
		return testplugins.Section(m, 10, append(testplugins.ULEB(nil, uint64(n)), bytes.Repeat(fn, n)...))
	}
	// The baseline: one such function, compiled on this machine, now.
	start := time.Now()
	c, err := rt.Compile(ctx, slow(1), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	one := time.Since(start)
	t.Logf("one function of 2 000 loops compiles in %v", one)

	// 1 000 such functions take 1 000 times as long (on one core): far
	// past a timeout of 4 functions' time.
	timeout := max(4*one, 500*time.Millisecond)
	wasm := slow(1000)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"timeout", func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) { // as SIGTERM does
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(timeout/2, cancel)
			return cctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			c, err := rt.Compile(cctx, wasm, sandbox.NewPolicy().WithCompileTimeout(timeout))
			took := time.Since(start)
			if err == nil {
				c.Close(ctx)
				t.Fatalf("compiled in %v; want it stopped", took)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %q; want one matching %v", err, tc.want)
			}
			if bound := timeout + 4*one + 3*time.Second; took > bound {
				t.Errorf("Compile returned after %v, over %v (the timeout, 4 functions' time and 3 s)", took, bound)
			}
			// The compilation goes on in the background only until its
			// workers finish the function each is in.
			deadline := time.Now().Add(20*one + 10*time.Second)
			for rt.Overrunning() > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the abandoned compilation still runs %v after Compile returned", time.Since(start)-took)
				}
				runtime.Gosched()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	// A Runtime closed while an abandoned compilation still runs waits
	// for it: wazero's engine, closed under it, made the compilation's
	// end write into a nil table and panic, ending the process.
	t.Run("closed while an abandoned compilation runs", func(t *testing.T) {
		rt2, err := sandbox.NewRuntime(sandbox.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := rt2.Compile(ctx, wasm, sandbox.NewPolicy().WithCompileTimeout(timeout)); err == nil {
			c.Close(ctx)
			t.Fatal("compiled; want it stopped")
		}
		if rt2.Overrunning() == 0 {
			t.Skip("the compilation ended with Compile: nothing runs in the background")
		}
		cctx, cancel := context.WithTimeout(ctx, 20*one+time.Minute)
		defer cancel()
		if err := rt2.Close(cctx); err != nil {
			t.Fatal(err)
		}
		if n := rt2.Compiling(); n != 0 {
			t.Fatalf("Close returned with %d compilations running under the closed cache", n)
		}
		deadline := time.Now().Add(20*one + 10*time.Second)
		for rt2.Overrunning() > 0 && time.Now().Before(deadline) {
			runtime.Gosched()
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// hostileHost returns an instance of fixture hostilehost.
func hostileHost(t *testing.T, p sandbox.Policy) *sandbox.Instance {
	return instantiate(t, compile(t, newRuntime(t), testplugins.Test(t, "hostilehost"), p))
}

// TestHostileTables: wazero counts tables in no memory limit, and a table
// with no maximum grows until table.grow's 2^32 entries (8 bytes each).
// The checker caps every table at MaxTableSize.
func TestHostileTables(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limits sandbox.ModuleLimits
		want   string
	}{
		{"default", sandbox.ModuleLimits{}, fmt.Sprintf("table grew to %d entries", sandbox.DefaultMaxTableSize)},
		{"lowered", sandbox.ModuleLimits{MaxTableSize: 1000}, "table grew to 0 entries"},
		{"raised", sandbox.ModuleLimits{MaxTableSize: 1 << 20}, "table grew to 1048576 entries"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inst := hostileHost(t, sandbox.NewPolicy().WithModuleLimits(tt.limits))
			got, err := callServlet(t, inst, "table_grow", `{}`)
			if err != nil || got != tt.want {
				t.Fatalf("table_grow: %q, %v; want %q", got, err, tt.want)
			}
			if got, err := callServlet(t, inst, "host_ok", `{}`); err != nil || got != "ok" {
				t.Errorf("host_ok after table_grow: %q, %v", got, err)
			}
		})
	}
}

// TestHostileVars: deleting a var that was never set used to wrap the
// vars' byte count around (after which 388 MiB of vars fit under the
// 1 MiB limit), and small vars cost the host 18 times what they were
// counted as.
func TestHostileVars(t *testing.T) {
	t.Run("delete_unset", func(t *testing.T) {
		inst := hostileHost(t, sandbox.NewPolicy())
		got, err := callServlet(t, inst, "var_ghost", `{}`)
		var he *sandbox.HostCallError
		if !errors.As(err, &he) || !strings.Contains(he.Reason, "over the 1048576-byte limit") {
			t.Fatalf("var_ghost: %q, %v; want a trap over the vars limit", got, err)
		}
	})
	t.Run("small", func(t *testing.T) {
		inst := hostileHost(t, sandbox.NewPolicy())
		before := heapAlloc()
		got, err := callServlet(t, inst, "var_small", `{}`)
		var he *sandbox.HostCallError
		if !errors.As(err, &he) || !strings.Contains(he.Reason, "var_set") && !strings.Contains(he.Error(), "var_set") {
			t.Fatalf("var_small: %q, %v; want var_set to trap", got, err)
		}
		grew := heapAlloc() - before
		t.Logf("vars trapped with %q; the heap grew by %d KiB", he.Reason, grew>>10)
		if raceEnabled {
			return
		}
		if grew > 2<<20 {
			t.Errorf("the instance's vars cost %d KiB of heap, over 2 MiB (the 1 MiB limit and 1 MiB for noise)", grew>>10)
		}
		runtime.KeepAlive(inst)
	})
}

// heapAlloc returns the bytes of live heap after a collection.
func heapAlloc() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// peakRSS returns the process's peak RSS since the last resetPeakRSS.
func peakRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			if kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// resetPeakRSS sets the peak RSS to the current RSS (Linux 4.0 and later).
func resetPeakRSS(t *testing.T) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skip("cannot reset the peak RSS:", err)
	}
}

// TestHostileMemoryGrowth grows an instance's memory page by page to its
// 256 MiB limit, touching every page: growth used to reallocate and copy
// the memory, and RSS peaked near three times the limit.
func TestHostileMemoryGrowth(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS meaningless")
	}
	const limit = 256 << 20
	c := compile(t, newRuntime(t), testplugins.Test(t, "hostilegrow"), sandbox.NewPolicy().WithMemoryLimit(limit))
	base := testplugins.RSS(t)
	resetPeakRSS(t)
	inst, err := c.Instantiate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, err := callServlet(t, inst, "grow", `{}`)
	if want := fmt.Sprintf("grew to %d pages", limit>>16); err != nil || got != want {
		t.Fatalf("grow: %q, %v; want %q", got, err, want)
	}
	peak := peakRSS(t) - base
	held := testplugins.RSS(t) - base
	inst.Close(context.Background())
	after := testplugins.RSS(t) - base
	t.Logf("RSS over the baseline: peak %d MiB, after growing %d MiB, after closing %d MiB (limit %d MiB)", peak>>20, held>>20, after>>20, limit>>20)
	if peak > limit+limit/4+32<<20 {
		t.Errorf("RSS peaked %d MiB over the baseline, for a %d MiB memory: growth copies", peak>>20, limit>>20)
	}
	if after > 32<<20 {
		t.Errorf("RSS is %d MiB over the baseline after closing the instance: its memory was not freed", after>>20)
	}
}

// TestHostileCloseDuringCall closes a module while its instance's guest
// writes to its memory in a loop: the memory is unmapped only once the
// call is over, never under the running guest (which would crash the
// process).
func TestHostileCloseDuringCall(t *testing.T) {
	running := make(chan struct{})
	var once sync.Once
	log := slog.New(funcHandler(func(r slog.Record) {
		if r.Message == "guest log" {
			once.Do(func() { close(running) })
		}
	}))
	rt := newRuntime(t)
	c, err := rt.Compile(context.Background(), testplugins.Bytes(t, testplugins.Test(t, "hostilehost")), sandbox.NewPolicy().WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	inst := instantiate(t, c)
	done := make(chan error, 1)
	go func() {
		_, err := callServlet(t, inst, "spin_memory", `{}`)
		done <- err
	}()
	<-running
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("the spinning call succeeded")
	}
}

// funcHandler is a slog.Handler calling a function for each record.
type funcHandler func(slog.Record)

func (h funcHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h funcHandler) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h funcHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h funcHandler) WithGroup(string) slog.Handler                 { return h }

// TestHostileManyCustomSections: a module of nothing but tiny custom
// sections is refused at its load, and the load allocates no more than a
// few times the module's size. Under wazero's interruption the DWARF ones
// (".debug_*") reach wazero, which allocated some 32 times the module's
// size for them (2 GB for a module at the default 64 MiB limit); under
// the flag they compiled, to no purpose.
func TestHostileManyCustomSections(t *testing.T) {
	ctx := context.Background()
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	for len(wasm) < 2<<20 {
		// ".debug_" and a byte: kept for wazero, and not empty, which
		// wazero refuses last.
		wasm = append(wasm, "\x00\x09\x07.debug_x"...)
	}
	for _, mode := range []struct {
		name string
		opt  sandbox.Interruption
	}{{"flag", sandbox.InterruptFlag}, {"wazero", sandbox.InterruptWazero}} {
		t.Run(mode.name, func(t *testing.T) {
			rt, err := sandbox.NewRuntime(sandbox.Options{Interruption: mode.opt})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close(ctx)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy())
			runtime.ReadMemStats(&after)
			if err == nil {
				c.Close(ctx)
				t.Error("a module of nothing but tiny custom sections compiled")
			} else if !strings.Contains(err.Error(), "custom sections") || !strings.Contains(err.Error(), fmt.Sprint(sandbox.MaxCustomSections)) {
				t.Errorf("refused for %v, want the custom sections' number and its bound", err)
			}
			got := after.TotalAlloc - before.TotalAlloc
			if got > uint64(4*len(wasm)) {
				t.Errorf("loading a module of %d bytes allocated %d MB", len(wasm), got>>20)
			}
			t.Logf("refusing a module of %d bytes allocated %d KB", len(wasm), got>>10)
			// The bound itself is no refusal.
			most := []byte("\x00asm\x01\x00\x00\x00")
			for range sandbox.MaxCustomSections {
				most = append(most, "\x00\x09\x07.debug_x"...)
			}
			if c, err := rt.Compile(ctx, most, sandbox.NewPolicy()); err != nil {
				t.Errorf("a module of %d custom sections: %v", sandbox.MaxCustomSections, err)
			} else {
				c.Close(ctx)
			}
			if c, err := rt.Compile(ctx, append(most, "\x00\x01\x00"...), sandbox.NewPolicy()); err == nil {
				c.Close(ctx)
				t.Errorf("a module of %d custom sections compiled", sandbox.MaxCustomSections+1)
			}
		})
	}
}
