package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// procFigures are what a leaked reservation would grow: the process's
// address space (a reservation is the memory limit's worth of it), its
// resident memory (committed pages written) and its open descriptors (a
// memfd).
type procFigures struct {
	vm, rss int64 // bytes
	fds     int
}

func readProcFigures(t *testing.T) procFigures {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return procFigures{vm: testplugins.AddressSpace(t), rss: testplugins.RSS(t), fds: len(fds)}
}

// Modules whose instances fail to start after wazero allocated their
// memory: in the start function, the initialisation, the
// pre-initialisation, or applying a data segment. The *Spin ones fail
// once their context is done.
const (
	failStartTrap = `(module (memory (export "memory") 1)
  (func $s unreachable) (start $s)
  (func (export "call") (result i32) (i32.const 0)))`
	failStartSpin = `(module (memory (export "memory") 1)
  (func $s (loop $l (br $l))) (start $s)
  (func (export "call") (result i32) (i32.const 0)))`
	failInitTrap = `(module (memory (export "memory") 1)
  (func (export "_initialize") unreachable)
  (func (export "call") (result i32) (i32.const 0)))`
	failInitSpin = `(module (memory (export "memory") 1)
  (func (export "_initialize") (loop $l (br $l)))
  (func (export "call") (result i32) (i32.const 0)))`
	failPreInitTrap = `(module (memory (export "memory") 1)
  (func (export "wizer.initialize") unreachable)
  (func (export "call") (result i32) (i32.const 0)))`
	failDataOutOfBounds = `(module (memory (export "memory") 1)
  (data (i32.const 65535) "ab")
  (func (export "call") (result i32) (i32.const 0)))`
	// switchStart's start function spins while its folder holds a
	// file named spin.
	switchStart = `(module
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func $stat (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "spin")
  (func $s
    (if (i32.eqz (call $stat (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 4) (i32.const 1024)))
      (then (loop $l (br $l)))))
  (start $s)
  (func (export "call") (result i32) (i32.const 0)))`
	// countStart starts; call writes a piece of its memory, so that a
	// snapshot after it holds a frame.
	countStart = `(module (memory (export "memory") 2)
  (func $s (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 1000)))))
  (start $s)
  (func (export "call") (result i32)
    (i32.store (i32.const 70000) (i32.const 0x12345678))
    (i32.const 0)))`
)

// TestHostileFailedStarts: an instance that fails to start after wazero
// allocated its memory (its start function, initialisation or
// pre-initialisation trapping or stopped by its context, a data segment
// out of bounds, its module closed under it, a restore failing on a
// corrupt frame; on a fresh reservation, a recycled one over the image,
// and without images), failed thousands of times, leaves nothing behind:
// not its reservation (the memory limit's worth of address space each),
// committed pages, a pooled reservation or a descriptor. wazero drops the
// memory of a module whose data segment is out of bounds without freeing
// it: each such failure kept its reservation mapped, so a client loading
// such a plugin again and again grew the host's address space by the
// memory limit each time (2,000 failures: 125 GiB), until mmap failed.
func TestHostileFailedStarts(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reservations are Linux's")
	}
	if testing.Short() {
		t.Skip("thousands of instantiations")
	}
	const limit = 64 << 20 // the default
	n := 2000
	if raceEnabled {
		n = 300 // still 300 reservations, 19 GiB of address space, if they leaked
	}
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	rt := newRuntime(t)
	compileWAT := func(t *testing.T, src string, p sandbox.Policy) *sandbox.Compiled {
		t.Helper()
		c, err := rt.Compile(ctx, wat(t, src), p.WithMemoryLimit(limit))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	// fails returns a failing start of a module compiled from src.
	fails := func(ctx context.Context, src string, p sandbox.Policy) func(t *testing.T) func() error {
		return func(t *testing.T) func() error {
			c := compileWAT(t, src, p)
			return func() error {
				inst, err := c.Instantiate(ctx)
				if err == nil {
					inst.Close(ctx)
				}
				return err
			}
		}
	}
	// onImage returns a start of switchStart's module from its image
	// that fails, its start function stopped by ctx: each after a start
	// that succeeds and gives its reservation back to the pool, so that
	// the one that fails takes it (and unmaps it, as a reservation freed
	// during a call is).
	onImage := func(ctx context.Context) func(t *testing.T) func() error {
		return func(t *testing.T) func() error {
			dir := t.TempDir()
			c := compileWAT(t, switchStart, sandbox.NewPolicy().WithImages(sandbox.ImagesOn).
				WithMounts(sandbox.Mount{HostPath: dir, GuestPath: "/switch"}))
			spin := func(on bool) {
				t.Helper()
				var err error
				if on {
					err = os.WriteFile(filepath.Join(dir, "spin"), nil, 0o644)
				} else {
					err = os.Remove(filepath.Join(dir, "spin"))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			first, err := c.Instantiate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			first.Close(context.Background())
			if !c.ImageMapped() {
				t.Skip("no image mapped here")
			}
			return func() error {
				ok, err := c.Instantiate(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ok.Close(context.Background())
				if c.Pooled() == 0 {
					t.Fatal("no reservation pooled for the next instance to take")
				}
				spin(true)
				defer spin(false)
				inst, err := c.Instantiate(ctx)
				if err == nil {
					inst.Close(context.Background())
				}
				return err
			}
		}
	}
	// corruptRestore returns a restore of a snapshot of countStart's
	// module whose last frame's checksum is wrong: it fails once the
	// instance is started, as it decodes the frame.
	corruptRestore := func(images sandbox.Images) func(t *testing.T) func() error {
		return func(t *testing.T) func() error {
			c := compileWAT(t, countStart, sandbox.NewPolicy().WithImages(images))
			inst, err := c.Instantiate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := inst.Call(ctx, "call", nil, nil); err != nil {
				t.Fatal(err)
			}
			snap, err := inst.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			inst.Close(ctx)
			snap[len(snap)-1] ^= 1
			return func() error {
				inst, err := c.Restore(ctx, snap)
				if err == nil {
					inst.Close(ctx)
					return nil
				}
				if !errors.Is(err, sandbox.ErrBadSnapshot) {
					t.Fatalf("restore: %v, want ErrBadSnapshot", err)
				}
				return err
			}
		}
	}
	for _, tt := range []struct {
		name  string
		start func(t *testing.T) func() error
		runs  int
	}{
		{"start function traps", fails(ctx, failStartTrap, sandbox.NewPolicy()), n},
		{"start function past its deadline", fails(expired, failStartSpin, sandbox.NewPolicy()), n},
		{"_initialize traps", fails(ctx, failInitTrap, sandbox.NewPolicy()), n},
		{"_initialize cancelled", fails(cancelled, failInitSpin, sandbox.NewPolicy()), n},
		{"pre-initialisation traps", fails(ctx, failPreInitTrap, sandbox.NewPolicy()), n},
		{"data segment out of bounds", fails(ctx, failDataOutOfBounds, sandbox.NewPolicy()), n},
		{"on a recycled reservation, start function cancelled", onImage(cancelled), n},
		{"restore on the image, a frame corrupt", corruptRestore(sandbox.ImagesOn), n},
		{"restore without images, a frame corrupt", corruptRestore(sandbox.ImagesOff), n},
		{"module closed under the start function", func(t *testing.T) func() error {
			wasm := wat(t, failStartSpin)
			return func() error {
				c, err := rt.Compile(ctx, wasm, sandbox.NewPolicy().WithMemoryLimit(limit))
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					inst, err := c.Instantiate(ctx)
					if err == nil {
						inst.Close(ctx)
					}
					done <- err
				}()
				time.Sleep(time.Millisecond) // mostly, the start function runs by now
				c.Close(ctx)
				err = <-done
				if !errors.Is(err, sandbox.ErrClosed) {
					t.Fatalf("instantiate under Close: %v, want ErrClosed", err)
				}
				return err
			}
		}, n / 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := tt.start(t)
			for k := range 10 { // what the path sets up once (a pool, a view of the image)
				err := start()
				if err == nil {
					t.Fatal("the instance started")
				}
				if k == 0 {
					t.Logf("fails: %v", err)
				}
			}
			before := readProcFigures(t)
			for range tt.runs {
				if err := start(); err == nil {
					t.Fatal("the instance started")
				}
			}
			after := readProcFigures(t)
			t.Logf("%d failed starts: VmSize %d → %d MiB, VmRSS %d → %d MiB, fds %d → %d",
				tt.runs, before.vm>>20, after.vm>>20, before.rss>>20, after.rss>>20, before.fds, after.fds)
			// One reservation leaked per failure is the memory limit's
			// worth of address space each: 2,000 are 125 GiB.
			if grew := after.vm - before.vm; grew > 8*limit {
				t.Errorf("address space grew by %d MiB over %d failed starts", grew>>20, tt.runs)
			}
			if grew := after.rss - before.rss; grew > 64<<20 && !raceEnabled {
				t.Errorf("RSS grew by %d MiB over %d failed starts", grew>>20, tt.runs)
			}
			if grew := after.fds - before.fds; grew > 4 {
				t.Errorf("%d more descriptors open after %d failed starts", grew, tt.runs)
			}
		})
	}
}
