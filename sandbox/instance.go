package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/wasmtools/wasmtools/abi"
)

// Instance is one live sandbox: a module's memory, globals and Extism vars.
// It is not safe for concurrent use: a guest is single-threaded, and the
// caller runs one call at a time. Close it when done; a trap or timeout
// closes it already.
type Instance struct {
	compiled *Compiled
	mod      api.Module
	kernel   kernel
	mem      *reservedMemory // nil where the memory is wazero's own
	// interrupt stops the guest (interrupt.go); nil where wazero's own
	// check does.
	interrupt *interrupter
	funcs     map[string]api.Function
	stack     [1]uint64
	err       error     // why the instance is closed, nil while usable
	host      HostFunc  // the current call's, nil between calls
	deadline  *deadline // the current call's: &dl during a call, else nil
	dl        deadline
	// callCtx is the current call's context, nil between calls; the
	// file grants of ask mounts the call was given are in fileGrants.
	callCtx    context.Context
	fileGrants []fileGrant
	log        *slog.Logger
	stdout     lineLogger
	stderr     lineLogger

	logTokens  float64 // the guest log rate limit, see allowLog
	logLast    time.Time
	logDropped int

	// wall and mono are the guest's fake clocks (Policy.WithFakeClock),
	// read by WASI, kept here so that a snapshot carries them and a
	// restored guest never sees time go backwards. Each holds its last
	// reading; each reading adds a millisecond. Unused with real clocks.
	wall, mono atomic.Int64

	// snapFrames are the frames of the last snapshot (or of the
	// snapshot the instance was restored from), which the next one
	// reuses where none of their pieces changed; snapCompressed counts
	// the pieces the last snapshot compressed anew (snapshot.go).
	// snapPieces is how many pieces of the memory snapFrames describes
	// whole (the memory is the base's but for them), 0 when it does not.
	snapFrames     cachedFrames
	snapCompressed int
	snapPieces     uint32
	// snapTracked says the last snapshot knew which pieces were written
	// from the kernel's write tracking (writes_linux.go), for tests.
	snapTracked bool
	// track is the instance's choice between tracking its memory's
	// writes and hashing the pieces it owns (track_choice.go).
	track trackChoice
	// snapSort is the snapshots' scratch memory (cachedFrames.sort).
	snapSort sortScratch
}

// fakeEpoch is the first reading of a guest's wall clock: midnight UTC
// 2022-01-01, as wazero's fake clock.
const fakeEpoch = 1640995200 * int64(time.Second)

// Instantiate creates an instance and runs its initialisation export
// (_initialize, else __wasm_call_ctors) under the policy's call timeout.
// A guest whose initialisation traps or overruns fails here.
//
// When the module uses pre-initialised images ([Compiled.UsesImages]),
// the first instance's state after its initialisation is kept as the
// image, and later instances start from it instead of initialising.
//
// It fails with [ErrClosed] once c is closed, or when c is closed under
// it.
func (c *Compiled) Instantiate(ctx context.Context) (*Instance, error) {
	if img := c.imageFor(); img != nil {
		inst, err := c.fromImage(ctx, img)
		return inst, c.closedErr(err)
	}
	inst, err := c.instantiate(ctx, true, nil)
	if err == nil && c.snap.images {
		c.keepImage(inst)
	}
	return inst, c.closedErr(err)
}

// closedErr returns err, or, when err is not nil and c was closed (under
// the instantiation or restore that failed with err: its memory freed,
// its image closed, wazero's runtime closed), an error matching
// [ErrClosed] that says so, whatever the failure made of it.
func (c *Compiled) closedErr(err error) error {
	if err == nil || errors.Is(err, ErrClosed) {
		return err
	}
	c.calls.Lock()
	closed := c.calls.closed
	c.calls.Unlock()
	if closed {
		return fmt.Errorf("%w: its module was closed: %v", ErrClosed, err)
	}
	return err
}

// instantiate creates an instance, running its initialisation export when
// initialise is set (a restore sets the state it would build instead).
// With img, the instance's memory is to become the image's (see
// reservedMemory.Reallocate).
func (c *Compiled) instantiate(ctx context.Context, initialise bool, img *image) (*Instance, error) {
	inst := &Instance{
		compiled: c,
		kernel: kernel{
			mem:       make([]byte, blockAlign, 256),
			limit:     c.policy.maxKernelMemory,
			maxOutput: c.policy.maxOutput,
			config:    c.policy.config,
		},
		funcs: make(map[string]api.Function, 4),
		log:   c.policy.log,
	}
	inst.stdout = lineLogger{inst: inst, stream: "stdout"}
	inst.stderr = lineLogger{inst: inst, stream: "stderr"}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(). // Extism guests initialise through an export, below
		WithStdout(&inst.stdout).
		WithStderr(&inst.stderr).
		WithRandSource(rand.Reader)
	if c.policy.fakeClock {
		// Deterministic clocks, served by the instance so that a
		// snapshot keeps them: a restored guest's time never runs
		// backwards.
		cfg = cfg.WithWalltime(func() (int64, int32) {
			t := inst.wall.Add(int64(time.Millisecond))
			return t / 1e9, int32(t % 1e9)
		}, sys.ClockResolution(time.Microsecond)).
			WithNanotime(func() int64 { return inst.mono.Add(int64(time.Millisecond)) }, sys.ClockResolution(1))
		inst.wall.Store(fakeEpoch - int64(time.Millisecond))
		inst.mono.Store(-int64(time.Millisecond))
	} else {
		// Real clocks, and a real sleep in slices of at most
		// maxSleepSlice: a host function cannot be interrupted, so a
		// guest's long sleep must come back often enough for its
		// deadline to stop it. (A runtime that sleeps until a time
		// loops over the slices.)
		cfg = cfg.WithSysWalltime().WithSysNanotime().WithNanosleep(func(ns int64) {
			time.Sleep(min(time.Duration(ns), maxSleepSlice))
		})
	}
	for k, v := range c.policy.env {
		cfg = cfg.WithEnv(k, v)
	}
	if fc := c.instanceFS(inst); fc != nil {
		cfg = cfg.WithFSConfig(fc)
	}
	ctx, cancel := context.WithTimeout(ctx, c.policy.callTimeout)
	defer cancel()
	// Closing the module stops the initialisation as it stops a call.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	if !c.startCall(inst, stop, nil) {
		return nil, fmt.Errorf("instantiate: %w: its module was closed", ErrClosed)
	}
	defer c.endCall(inst)
	ctx = context.WithValue(ctx, instanceKey{}, inst)
	ctx = experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
		var m *reservedMemory
		if img != nil && img.file != nil {
			m = img.file.take(max) // a reservation freed by an earlier instance, reset
		}
		if m == nil {
			m = reserveMemory(max)
		}
		if m != nil {
			m.busy = true // the start function runs next; see exit below
			if img != nil && img.file != nil {
				m.img, m.imgSize = img.file, img.size
				if !c.snap.hasStart {
					m.scratch = &c.snap.scratch
				}
			}
			inst.mem = m
			return m
		}
		return &sliceMemory{}
	}))
	defer func() { inst.mem.exit() }() // inst.mem is set during InstantiateModule
	mod, err := c.rt.InstantiateModule(ctx, c.mod, cfg)
	if err != nil && inst.mem != nil {
		// wazero drops the memory of a module whose instantiation failed
		// after allocating it (a data segment out of bounds) without
		// freeing it: freed here, its reservation is unmapped by the exit
		// above. Where wazero did free it (closing the module), this
		// second Free changes nothing.
		inst.mem.Free()
	}
	if err == nil {
		// The memory is not the reservation (see reservedMemory.Reallocate):
		// the guest never runs on it.
		if err = inst.mem.startFailed(); err != nil {
			_ = mod.Close(context.Background())
			err = fmt.Errorf("memory: %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", contextCause(ctx, err))
	}
	inst.mod = mod
	flag, _ := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
	budget, _ := mod.ExportedGlobal(budgetExport).(api.MutableGlobal)
	if flag != nil && budget != nil {
		inst.interrupt = newInterrupter(flag, budget)
	}
	// The module's start function, which instrument made an export so
	// that it runs here, under the flag: as part of every instantiation.
	if f := mod.ExportedFunction(startExport); f != nil {
		if err := inst.callInit(ctx, f); err != nil {
			_ = mod.Close(context.Background())
			return nil, fmt.Errorf("instantiate: %w", &TrapError{Export: "start function", Cause: ctxErr(ctx), Err: err})
		}
	}
	if !initialise {
		return inst, nil
	}
	for _, name := range []string{abi.ExportInitialize, abi.ExportCallCtors} {
		if f := mod.ExportedFunction(name); f != nil {
			if err := inst.callInit(ctx, f); err != nil {
				_ = mod.Close(context.Background())
				return nil, fmt.Errorf("initialise: %w", &TrapError{Export: name, Cause: ctxErr(ctx), Err: err})
			}
			break
		}
	}
	// Wizer's pre-initialisation, in the same deadline: its state goes
	// into the image when there is one (abi.ExportPreInitialize).
	if f := mod.ExportedFunction(abi.ExportPreInitialize); f != nil && len(f.Definition().ParamTypes()) == 0 {
		if err := inst.callInit(ctx, f); err != nil {
			_ = mod.Close(context.Background())
			return nil, fmt.Errorf("pre-initialise: %w", &TrapError{Export: abi.ExportPreInitialize, Cause: ctxErr(ctx), Err: err})
		}
	}
	return inst, nil
}

// callInit runs an initialisation function under ctx.
func (i *Instance) callInit(ctx context.Context, f api.Function) error {
	stop := i.interrupt.arm(ctx)
	defer i.interrupt.disarm(stop)
	_, err := f.Call(ctx)
	return err
}

// maxSleepSlice bounds one guest sleep with real clocks (see Instantiate).
const maxSleepSlice = 10 * time.Millisecond

func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}

func contextCause(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w: %v", cerr, err)
	}
	return err
}

// Call runs export with input and returns what the guest set as its output.
// host serves the guest's extism:host/user calls; nil refuses them (the
// guest traps, told they are not available).
//
// The export must take no parameters and return nothing or an i32; a
// non-zero i32 is a [GuestError] carrying the guest's error message, and
// the instance stays usable. A trap, guest exit, host-function refusal or
// the end of ctx (or of the policy's call timeout) is a [TrapError], and
// closes the instance: its memory may be inconsistent.
//
// What only some calls do (refusals, a trap, a guest's error) and what
// every call does before and after the guest runs are in functions of
// their own, so that this frame, which stays on the stack under the
// guest's host calls, is small: a call's goroutine that fits in 8 KiB of
// stack is not copied to a larger one (docs/DESIGN.md, "The Go guest
// inside the server").
func (i *Instance) Call(ctx context.Context, export string, input []byte, host HostFunc) ([]byte, error) {
	f, err := i.begin(export, input)
	if err != nil {
		return nil, err
	}
	// The guest is interrupted by each of what ends its call, directly:
	// the deadline's timer, Close and the end of the caller's context
	// (the one AfterFunc, on parent). ctx, which the host functions see,
	// ends with them, but no AfterFunc on it sets the flag: that was
	// five more allocations a call (issue 27, item 2). The interrupter
	// is armed first: its clearing of the flag comes before the deadline
	// or Close may set it.
	parent := ctx
	stop := i.interrupt.arm(parent)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !i.compiled.startCall(i, cancel, i.interrupt) {
		i.interrupt.disarm(stop)
		return nil, errModuleClosed
	}
	defer i.compiled.endCall(i)
	ctx = i.enter(ctx, host, cancel)
	defer i.leave()
	err = f.CallWithStack(ctx, i.stack[:])
	i.dl.stop() // before disarm: then nothing sets the flag of a call that ended
	i.interrupt.disarm(stop)
	i.mem.exit()
	if err != nil {
		return nil, i.trapped(ctx, parent, export, err)
	}
	return i.result(export, f)
}

// errModuleClosed is Call's refusal on an instance whose module was
// closed under it.
var errModuleClosed = fmt.Errorf("%w: its module was closed", ErrClosed)

// begin is the export a call of export runs, with the kernel reset to
// input; or why there is none.
//
//go:noinline
func (i *Instance) begin(export string, input []byte) (api.Function, error) {
	if i.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrClosed, i.err)
	}
	f, err := i.function(export)
	if err != nil {
		return nil, err
	}
	if err := i.kernel.reset(input); err != nil {
		return nil, fmt.Errorf("%s: %w", export, err)
	}
	return f, nil
}

// enter sets up a call that serves host and ends with cancel: its
// deadline, its context (returned) and the guest's memory.
//
//go:noinline
func (i *Instance) enter(ctx context.Context, host HostFunc, cancel context.CancelCauseFunc) context.Context {
	i.dl.arm(i.compiled.policy.callTimeout, cancel, i.interrupt)
	i.deadline = &i.dl
	i.host = host
	ctx = context.WithValue(ctx, instanceKey{}, i)
	i.callCtx = ctx
	i.stack[0] = 0
	i.mem.enter()
	return ctx
}

// leave undoes enter, once the guest has run.
//
//go:noinline
func (i *Instance) leave() {
	i.deadline.stop()
	i.host, i.deadline, i.callCtx = nil, nil, nil
	clear(i.fileGrants)
	i.kernel.shrink()
	i.reportDropped()
}

// trapped closes the instance after a trap (err) of export and returns
// the call's error. ctx is the call's, derived from parent, the caller's.
//
//go:noinline
func (i *Instance) trapped(ctx, parent context.Context, export string, err error) error {
	te := &TrapError{Export: export, Err: err}
	switch {
	case ctx.Err() != nil:
		te.Cause = context.Cause(ctx)
	case parent.Err() != nil:
		// The flag set as parent ended, and the guest stopped, before
		// parent's cancellation reached ctx.
		te.Cause = context.Cause(parent)
	}
	i.close(te)
	return te
}

// result is the output of a call of export (f) that ran to its end, or the
// guest's error.
//
//go:noinline
func (i *Instance) result(export string, f api.Function) ([]byte, error) {
	i.stdout.flush()
	i.stderr.flush()
	if len(f.Definition().ResultTypes()) == 1 && uint32(i.stack[0]) != 0 {
		msg, _ := i.kernel.errorMessage()
		return nil, &GuestError{Export: export, Message: msg}
	}
	return i.kernel.output(), nil
}

func (i *Instance) function(export string) (api.Function, error) {
	if f, ok := i.funcs[export]; ok {
		return f, nil
	}
	f := i.mod.ExportedFunction(export)
	if f == nil || export == startExport {
		return nil, fmt.Errorf("%w: %q", ErrNoExport, export)
	}
	d := f.Definition()
	if len(d.ParamTypes()) != 0 || len(d.ResultTypes()) > 1 || (len(d.ResultTypes()) == 1 && d.ResultTypes()[0] != api.ValueTypeI32) {
		return nil, fmt.Errorf("export %q has signature %s, but the Extism ABI needs () -> (i32) or () -> ()", export, signature(d))
	}
	i.funcs[export] = f
	return f, nil
}

// Err reports why the instance is closed, or nil while it is usable.
func (i *Instance) Err() error { return i.err }

// MemorySize reports the guest's linear memory size in bytes.
func (i *Instance) MemorySize() uint64 {
	if m := moduleMemory(i.mod); m != nil {
		return uint64(m.Size())
	}
	return 0
}

// Close frees the instance. It is idempotent.
func (i *Instance) Close(ctx context.Context) error {
	if i.err != nil {
		return nil
	}
	i.err = ErrClosed
	i.snapFrames, i.snapPieces, i.snapSort = nil, 0, sortScratch{}
	return i.mod.Close(ctx)
}

func (i *Instance) close(reason error) {
	i.err = reason
	i.snapFrames, i.snapPieces, i.snapSort = nil, 0, sortScratch{}
	_ = i.mod.Close(context.Background())
}

// Guest log output (log_* imports, stdout and stderr lines) is
// rate-limited per instance, so a guest in a loop cannot flood the host's
// log: a burst of logBurst records, then logPerSecond. What is dropped is
// counted and reported once per call.
const (
	logBurst     = 20
	logPerSecond = 50
)

// allowLog reports whether a guest log record may be written now.
func (i *Instance) allowLog() bool {
	now := time.Now()
	if i.logLast.IsZero() {
		i.logTokens, i.logLast = logBurst, now
	}
	i.logTokens = min(logBurst, i.logTokens+now.Sub(i.logLast).Seconds()*logPerSecond)
	i.logLast = now
	if i.logTokens >= 1 {
		i.logTokens--
		return true
	}
	i.logDropped++
	return false
}

func (i *Instance) reportDropped() {
	if i.logDropped > 0 {
		i.log.Warn("plugin output dropped by the rate limit", "records", i.logDropped)
		i.logDropped = 0
	}
}

// logGuest sends a guest's log message to the policy's logger. Whether
// the logger takes the level is asked first, from this small frame:
// slog's Log builds its record in its own frame (about 1 KiB) before it
// asks, which took a call's goroutine past 8 KiB of stack over HTTP, and
// so had it copied to 16 KiB, for a message then dropped
// (TestCallStackNotCopied).
func (i *Instance) logGuest(ctx context.Context, level slog.Level, msg []byte) {
	if i.log.Enabled(ctx, level) && i.allowLog() {
		i.logRecord(ctx, level, msg)
	}
}

// logRecord logs msg; its caller has checked the level.
//
//go:noinline
func (i *Instance) logRecord(ctx context.Context, level slog.Level, msg []byte) {
	i.log.Log(ctx, level, "guest log", "message", string(msg))
}

// lineLogger turns guest stdout or stderr into one log record per line. A
// line longer than maxLogLine is logged in pieces.
type lineLogger struct {
	inst   *Instance
	stream string
	buf    []byte
}

const maxLogLine = 4096

func (w *lineLogger) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if j := bytes.IndexByte(p, '\n'); j >= 0 {
			w.buf = append(w.buf, p[:j]...)
			w.flush()
			p = p[j+1:]
			continue
		}
		room := maxLogLine - len(w.buf)
		if len(p) < room {
			w.buf = append(w.buf, p...)
			break
		}
		w.buf = append(w.buf, p[:room]...)
		w.flush()
		p = p[room:]
	}
	return n, nil
}

func (w *lineLogger) flush() {
	if len(w.buf) == 0 {
		return
	}
	if w.inst.allowLog() {
		w.inst.log.Info("guest "+w.stream, "line", string(w.buf))
	}
	w.buf = w.buf[:0]
}

// moduleMemory returns mod's linear memory, or nil when it has none
// (wazero v1.12 returns a nil *MemoryInstance in a non-nil api.Memory).
func moduleMemory(mod api.Module) api.Memory {
	m := mod.Memory()
	if m == nil || reflect.ValueOf(m).IsNil() {
		return nil
	}
	return m
}
