package plugins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/wasmtools/wasmtools/sandbox"
)

// TestTransientClassification: which failures are tried again, decided
// by the errors' types, not their text.
func TestTransientClassification(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	path := func(errno syscall.Errno) error {
		return fmt.Errorf("plugin file x.wasm: %w", &fs.PathError{Op: "open", Path: "x.wasm", Err: errno})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"read: EIO", transientRead(path(syscall.EIO)), true},
		{"read: too many open files", transientRead(path(syscall.EMFILE)), true},
		{"read: stale NFS handle", transientRead(path(syscall.ESTALE)), true},
		{"read: missing", transientRead(path(syscall.ENOENT)), false},
		{"read: permission", transientRead(path(syscall.EACCES)), false},
		{"read: not a regular file", transientRead(fmt.Errorf("%w (a FIFO): refused", ErrNotRegular)), false},
		{"load: deadline", transientLoad(context.Background(), fmt.Errorf("plugin: %w", context.DeadlineExceeded)), true},
		{"load: a trap's deadline", transientLoad(context.Background(), &sandbox.TrapError{Export: "_start", Cause: context.DeadlineExceeded, Err: errors.New("stopped")}), true},
		{"load: the rescan called off", transientLoad(done, fmt.Errorf("plugin: %w", context.DeadlineExceeded)), false},
		{"load: a guest that says timeout", transientLoad(context.Background(), &sandbox.GuestError{Export: "describe", Message: "context deadline exceeded"}), false},
		{"load: invalid module", transientLoad(context.Background(), errors.New("compile: invalid magic number")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var te *TransientError
			if got := errors.As(tc.err, &te); got != tc.want {
				t.Errorf("transient = %v, want %v (%v)", got, tc.want, tc.err)
			}
		})
	}
}
