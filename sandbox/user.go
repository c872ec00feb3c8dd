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
// Functions the guest may wait on for long, like create_elicitation, do
// not count against the call timeout while they run.
type HostFunc func(ctx context.Context, name string, input []byte) ([]byte, error)

// MaxHostInput bounds the JSON a guest may pass to one host function; a
// larger block traps before the host copies it.
const MaxHostInput = 1 << 20

// blocking names the user functions that wait for a person.
func blocking(name string) bool {
	switch name {
	case abi.FuncCreateElicitation, abi.FuncCreateMessage, abi.FuncListRoots, abi.FuncRequestInputs:
		return true
	}
	return false
}

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
			if f.Returns {
				s[0] = inst.kernel.writeBlock(f.Name, out)
			}
		}), params, results).WithName(f.Name).Export(f.Name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// callHost runs the current call's HostFunc, pausing the call's deadline
// while a blocking function waits.
func (i *Instance) callHost(ctx context.Context, name string, input []byte) ([]byte, error) {
	if i.host == nil {
		return nil, fmt.Errorf("not available outside an MCP tool call")
	}
	if blocking(name) && i.deadline != nil {
		i.deadline.pause()
		defer i.deadline.resume()
	}
	return i.host(ctx, name, input)
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
	paused int                     // pauses not resumed yet
}

// arm starts a call's deadline, d from now, at which cancel ends it.
func (dl *deadline) arm(d time.Duration, cancel context.CancelCauseFunc) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.left, dl.start, dl.cancel, dl.paused = d, time.Now(), cancel, 0
	if dl.timer == nil {
		dl.timer = time.AfterFunc(d, dl.fire)
	} else {
		dl.timer.Reset(d)
	}
}

// fire is the timer's: it ends the armed call if its time is up. A
// firing of the call before may run after the next call was armed (a
// timer's function that has started is not stopped): the next call's
// time is not up yet, so it is left alone.
func (dl *deadline) fire() {
	dl.mu.Lock()
	cancel := dl.cancel
	if dl.paused > 0 || time.Since(dl.start) < dl.left {
		cancel = nil
	}
	dl.mu.Unlock()
	if cancel != nil {
		cancel(context.DeadlineExceeded)
	}
}

// pause stops the clock while the guest waits for a person. A call whose
// time ran out as it paused (its timer's firing may be waiting for the
// lock, and would then find the call paused) ends now, not at resume.
func (dl *deadline) pause() {
	dl.mu.Lock()
	var cancel context.CancelCauseFunc
	if dl.paused++; dl.paused == 1 {
		dl.timer.Stop()
		if dl.left -= time.Since(dl.start); dl.left <= 0 {
			cancel = dl.cancel
		}
	}
	dl.mu.Unlock()
	if cancel != nil {
		cancel(context.DeadlineExceeded)
	}
}

func (dl *deadline) resume() {
	dl.mu.Lock()
	if dl.paused--; dl.paused > 0 {
		dl.mu.Unlock()
		return
	}
	dl.start = time.Now()
	left, cancel := dl.left, dl.cancel
	if left > 0 {
		dl.timer.Reset(left)
	}
	dl.mu.Unlock()
	if left <= 0 && cancel != nil {
		cancel(context.DeadlineExceeded)
	}
}

// stop disarms the deadline at the end of its call.
func (dl *deadline) stop() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.timer.Stop()
	dl.cancel, dl.paused = nil, 0
}
