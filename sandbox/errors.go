package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tetratelabs/wazero/sys"
)

var (
	// ErrClosed is returned by calls on an instance or compiled module
	// that was closed, or that a trap or timeout closed.
	ErrClosed = errors.New("sandbox: instance closed")
	// ErrNoExport is returned when a call names an export the module
	// does not have.
	ErrNoExport = errors.New("sandbox: no such export")
)

// GuestError is a call that the guest itself failed: its export returned
// non-zero, with the message it set with error_set. The instance remains
// usable.
type GuestError struct {
	Export  string
	Message string
}

func (e *GuestError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%s: guest returned an error with no message", e.Export)
	}
	return fmt.Sprintf("%s: %s", e.Export, e.Message)
}

// TrapError is a call that ended abnormally: a Wasm trap (unreachable,
// out-of-bounds access, stack exhaustion), a guest panic or exit, a host
// function refusing what the guest asked, or the call's context ending.
// The instance is closed afterwards and must be replaced.
//
// A TrapError caused by the context matches context.DeadlineExceeded or
// context.Canceled with errors.Is.
type TrapError struct {
	Export string
	// Cause is the context's error when the context ended the call.
	Cause error
	Err   error
}

func (e *TrapError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: stopped: %v", e.Export, e.Cause)
	}
	return fmt.Sprintf("%s: trapped: %v", e.Export, e.Err)
}

func (e *TrapError) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Cause, e.Err}
	}
	return []error{e.Err}
}

// Reason is why the call ended, in one line for the person or model who
// made it: the host function's refusal, or the trap's own message, without
// wazero's wording ("(recovered by wazero)") and the Wasm stack trace,
// which stay in Error for the operator's log.
func (e *TrapError) Reason() string {
	if e.Cause != nil {
		return "stopped: " + e.Cause.Error()
	}
	var hc *HostCallError
	if errors.As(e.Err, &hc) {
		return hc.Error()
	}
	var exit *sys.ExitError
	if errors.As(e.Err, &exit) {
		return fmt.Sprintf("the guest exited with code %d", exit.ExitCode())
	}
	first, _, _ := strings.Cut(e.Err.Error(), "\n")
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(first), "(recovered by wazero)"))
}

// Is reports context errors for a call the context ended.
func (e *TrapError) Is(target error) bool {
	return e.Cause != nil && (target == context.DeadlineExceeded || target == context.Canceled) && errors.Is(e.Cause, target)
}

// HostCallError is what a host function panics with when the guest asks for
// something invalid or over a limit: an offset outside its memory blocks, an
// output over the limit. wazero turns the panic into a trap, and the call
// returns a [TrapError] wrapping it.
type HostCallError struct {
	Func   string
	Reason string
	// Err is the error behind Reason when it is one callers may match,
	// such as a [*NetworkError]; nil otherwise.
	Err error
}

func (e *HostCallError) Unwrap() error { return e.Err }

func (e *HostCallError) Error() string {
	return fmt.Sprintf("host function %s: %s", e.Func, e.Reason)
}
