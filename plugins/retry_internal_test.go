package plugins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
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

// TestReadRetryKeepsOneTimer: a file whose read fails for a reason that
// may pass is read again by each rescan meanwhile (SIGHUP, a change of
// another file, another file's retry), which counts as an attempt and
// sets the next one; the attempt it replaces is called off, not left to
// run as well. Each such rescan left one more timer that rescanned at
// each backoff, so the file was read ever faster and given up long
// before RetryAttempts' backoff had passed.
func TestReadRetryKeepsOneTimer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "hash.wasm")
	if err := os.WriteFile(path, testplugins.Bytes(t, testplugins.Example(t, "hash")), 0o644); err != nil {
		t.Fatal(err)
	}
	reads := make(chan time.Time, 1000)
	readHook = func(p string) error {
		if p != path {
			return nil
		}
		select {
		case reads <- time.Now():
		default:
		}
		return &fs.PathError{Op: "read", Path: p, Err: syscall.EIO}
	}
	defer func() { readHook = nil }()
	const every = 300 * time.Millisecond
	r := NewReloader(testplugins.Runtime(t), ReloaderOptions{Paths: []string{dir}, RetryMin: every, RetryMax: every, RetryAttempts: 1000})
	defer r.Close(ctx)
	r.Load(ctx)
	for range 5 {
		r.Rescan(ctx) // as SIGHUP does
	}
	for len(reads) > 0 {
		<-reads
	}
	// One attempt at a time, each set when the one before failed: 12
	// reads take at least 11 backoffs, whatever the machine's load.
	start := time.Now()
	var last time.Time
	for range 12 {
		select {
		case last = <-reads:
		case <-time.After(time.Minute):
			t.Fatal("the read was not tried again")
		}
	}
	if took := last.Sub(start); took < 11*every {
		t.Errorf("12 retried reads took %v, with a backoff of %v: more than one attempt is due at a time", took, every)
	}
}

// TestRetryAttemptsOne: RetryAttempts 1 gives a load that fails for a
// reason that may pass up at its first failure, with no attempt set.
func TestRetryAttemptsOne(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "hash.wasm")
	if err := os.WriteFile(path, testplugins.Bytes(t, testplugins.Example(t, "hash")), 0o644); err != nil {
		t.Fatal(err)
	}
	readHook = func(p string) error { return &fs.PathError{Op: "read", Path: p, Err: syscall.EIO} }
	defer func() { readHook = nil }()
	r := NewReloader(testplugins.Runtime(t), ReloaderOptions{Paths: []string{dir}, RetryAttempts: 1})
	defer r.Close(ctx)
	r.Load(ctx)
	if s := r.Status(); len(s) != 1 || s[0].State != StateError || !s[0].RetryAt.IsZero() {
		t.Errorf("status: %+v; want an error, given up", s)
	}
}
