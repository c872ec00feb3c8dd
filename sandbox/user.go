package sandbox

import (
	"context"
	"fmt"
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
// waiting for a person does not count.
type deadline struct {
	left   time.Duration
	start  time.Time
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

func newDeadline(d time.Duration, cancel context.CancelCauseFunc) *deadline {
	dl := &deadline{left: d, start: time.Now(), cancel: cancel}
	dl.timer = time.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return dl
}

func (d *deadline) pause() {
	if d.timer.Stop() {
		d.left -= time.Since(d.start)
	}
}

func (d *deadline) resume() {
	d.start = time.Now()
	if d.left <= 0 {
		d.cancel(context.DeadlineExceeded)
		return
	}
	d.timer.Reset(d.left)
}

func (d *deadline) stop() { d.timer.Stop() }
