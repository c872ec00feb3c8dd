package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasmtools/wasmtools/abi"
)

// HostFunc serves the guest's calls to module extism:host/user during one
// export call: name is the function (see [abi.UserFuncs]), input the JSON
// the guest passed (already checked to be in bounds, under
// [MaxHostInput] and valid UTF-8), and the output, for functions that
// return an offset, is handed back to the guest in a new block.
//
// An error from a function that returns nothing traps the guest (its call
// fails with the error's text). For functions that return an offset, the
// HostFunc reports failures in its output, in the shape the function
// documents, and an error still traps.
//
// A HostFunc's time counts against the call timeout, but for the time it
// waits for a person, which it brackets with [PauseDeadline].
type HostFunc func(ctx context.Context, name string, input []byte) ([]byte, error)

// MaxHostInput bounds the JSON a guest may pass to one host function; a
// larger block traps before the host copies it.
const MaxHostInput = 1 << 20

// instantiateUser defines module extism:host/user in rt.
func instantiateUser(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(abi.UserModule)
	for _, f := range abi.UserFuncs() {
		var params, results []api.ValueType
		if f.Input {
			params = []api.ValueType{api.ValueTypeI64}
		}
		if f.Returns {
			results = []api.ValueType{api.ValueTypeI64}
		}
		b.NewFunctionBuilder().WithGoFunction(api.GoFunc(func(ctx context.Context, s []uint64) {
			inst := ctx.Value(instanceKey{}).(*Instance)
			var input []byte
			if f.Input {
				block, err := inst.kernel.bytes(f.Name, s[0])
				if err != nil {
					trap(err)
				}
				if len(block) > MaxHostInput {
					trap(&HostCallError{Func: f.Name, Reason: fmt.Sprintf("input of %d bytes is over the %d-byte limit", len(block), MaxHostInput)})
				}
				if !utf8.Valid(block) {
					trap(&HostCallError{Func: f.Name, Reason: "input is not valid UTF-8"})
				}
				input = append([]byte(nil), block...)
			}
			out, err := inst.callHost(ctx, f.Name, input)
			if err != nil {
				trap(&HostCallError{Func: f.Name, Reason: err.Error()})
			}
			endedMeanwhile(ctx, f.Name)
			if f.Returns {
				s[0] = inst.kernel.writeBlock(f.Name, out)
			}
		}), params, results).WithName(f.Name).Export(f.Name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// endedMeanwhile traps if ctx, the context of the call a host function
// (fn) serves, ended while it ran: its deadline, or the client's
// cancellation, came as the host waited for a concurrency token after a
// person answered, or for the answer itself. The guest would stop at its
// next interruption check, but one that returns at once never reaches
// one: its result would be taken for a call that had ended, and its code
// would have run without the token the call gave back.
func endedMeanwhile(ctx context.Context, fn string) {
	if ctx.Err() != nil {
		trap(&HostCallError{Func: fn, Reason: "the call ended while the host served it"})
	}
}

// callHost runs the current call's HostFunc.
func (i *Instance) callHost(ctx context.Context, name string, input []byte) ([]byte, error) {
	if i.host == nil {
		return nil, fmt.Errorf("not available outside an MCP tool call")
	}
	return i.host(ctx, name, input)
}

// PauseDeadline stops the clock of the call whose HostFunc or [Asker] was
// given ctx, while the host waits for a person (a question, a sampling
// request): that time does not count against the call timeout. The rest
// of a host function's work does, decoding what the guest passed
// included: a guest that called a function in a loop with input the host
// refuses, and that took long to read, ran for hundreds of times its
// timeout while the whole function was paused. Pauses nest. The caller
// runs resume once, on the guest's goroutine, before its function
// returns. A call whose time had run out is ended as it pauses: ctx is
// then done, and the caller asks no one.
func PauseDeadline(ctx context.Context) (resume func()) {
	i, _ := ctx.Value(instanceKey{}).(*Instance)
	if i == nil || i.deadline == nil {
		return func() {}
	}
	dl := i.deadline
	dl.pause()
	return dl.resume
}

// deadline is a call timeout that can be paused: the time a guest spends
// waiting for a person does not count. An instance keeps one, and its
// timer, for all its calls (one at a time): a new timer for each call was
// three allocations of it.
type deadline struct {
	mu     sync.Mutex
	left   time.Duration // the timeout left when the timer was last set
	start  time.Time     // when it was last set
	timer  *time.Timer
	cancel context.CancelCauseFunc // the armed call's; nil between calls
	intr   *interrupter            // the armed call's guest's (nil-safe)
	paused int                     // pauses not resumed yet
}

// arm starts a call's deadline, d from now, at which cancel ends it and
// intr interrupts its guest.
func (dl *deadline) arm(d time.Duration, cancel context.CancelCauseFunc, intr *interrupter) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.left, dl.start, dl.cancel, dl.intr, dl.paused = d, time.Now(), cancel, intr, 0
	if dl.timer == nil {
		dl.timer = time.AfterFunc(d, dl.fire)
	} else {
		dl.timer.Reset(d)
	}
}

// end ends the armed call, with dl.mu held: its context first, so that
// the guest stopped by its flag finds the call timed out. Under the lock,
// as stop takes it before the call's interrupter is disarmed, a firing
// left over never sets the flag of a call that has ended or of the next.
// (Cancelling runs no code of others here: the context's children are
// the standard library's, and an AfterFunc's function runs on a
// goroutine of its own.)
func (dl *deadline) end() {
	if dl.cancel != nil {
		dl.cancel(context.DeadlineExceeded)
		dl.intr.interrupt()
	}
}

// fire is the timer's: it ends the armed call if its time is up. A
// firing of the call before may run after the next call was armed (a
// timer's function that has started is not stopped): the next call's
// time is not up yet, so it is left alone.
func (dl *deadline) fire() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.paused == 0 && time.Since(dl.start) >= dl.left {
		dl.end()
	}
}

// pause stops the clock while the guest waits for a person. A call whose
// time ran out as it paused (its timer's firing may be waiting for the
// lock, and would then find the call paused) ends now, not at resume.
func (dl *deadline) pause() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.paused++; dl.paused == 1 {
		dl.timer.Stop()
		if dl.left -= time.Since(dl.start); dl.left <= 0 {
			dl.end()
		}
	}
}

func (dl *deadline) resume() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.paused <= 0 {
		// Not paused (the call has ended, or a resume is unmatched): a
		// resume must not give a call its time again.
		return
	}
	if dl.paused--; dl.paused > 0 {
		return
	}
	dl.start = time.Now()
	if dl.left > 0 {
		dl.timer.Reset(dl.left)
	} else {
		dl.end()
	}
}

// stop disarms the deadline at the end of its call.
func (dl *deadline) stop() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.timer != nil {
		dl.timer.Stop()
	}
	dl.cancel, dl.intr, dl.paused = nil, nil, 0
}
