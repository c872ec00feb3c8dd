package plugins

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Defaults of ReloaderOptions.RetryMin and RetryMax.
const (
	DefaultRetryMin = time.Second
	DefaultRetryMax = time.Minute
	// DefaultRetryAttempts is ReloaderOptions.RetryAttempts' default:
	// about 5 minutes of attempts at the default backoff.
	DefaultRetryAttempts = 10
)

// TransientError is a plugin load that failed for a reason of the moment,
// not of the file or of the configuration: its compilation or its load
// ran out of time (a loaded machine), or reading the file failed with an
// I/O error that may pass (EIO, a stale NFS handle, too many open files).
// The reloader loads such a file again, with backoff (see
// [ReloaderOptions.RetryMin]), and its status is [StateRetrying]; every
// other failure (bytes that are not a valid module, a refusal of the
// check or of the catalogue, a grant that cannot be satisfied) waits for
// the file or the configuration to change.
type TransientError struct{ Err error }

func (e *TransientError) Error() string { return e.Err.Error() }
func (e *TransientError) Unwrap() error { return e.Err }

// transientLoad returns err, the failure of a load (compile, start,
// lists) under ctx, as a TransientError when a time bound of the
// plugin's own ended it; not when ctx ended (the rescan was called off,
// or the load was found slow: see errSlowLoad).
func transientLoad(ctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return &TransientError{Err: err}
	}
	return err
}

// transientRead returns err, the failure of reading a plugin file, as a
// TransientError when the operating system says it may pass. A file that
// is missing, unreadable to us, not a regular file or too large stays so
// until it changes, which the watcher hears of.
func transientRead(err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch {
	case errno == syscall.EIO, errno == syscall.ESTALE, errno == syscall.ENOMEM, errno == syscall.EBUSY,
		errno.Temporary(): // EINTR, EMFILE, ENFILE, EAGAIN, ETIMEDOUT
		return &TransientError{Err: err}
	}
	return err
}

// retry is a file's load tried again after a transient failure: of the
// bytes (sha256, "" when they could not be read) and configuration
// generation it failed with. Another version or configuration starts
// afresh. The reloader's lock guards it.
type retry struct {
	sha      string
	gen      int
	wait     time.Duration // before the attempt due
	attempts int           // failed so far
	timer    *time.Timer
}

// failLocked records err, the failure of loading f's bytes sha: a
// transient one has the file loaded again later, any other stops that.
// It returns err. The caller holds r.mu.
func (r *Reloader) failLocked(f *fileState, sha string, err error) error {
	var te *TransientError
	if !errors.As(err, &te) || r.closing {
		r.stopRetryLocked(f)
		return r.fail(f, err)
	}
	rt := f.retry
	again := rt != nil && rt.sha == sha && rt.gen == r.gen
	if again {
		// The attempt due, if a rescan meanwhile (SIGHUP, another
		// file's change or retry) read the file before it, is this
		// one: left running, each such rescan added an attempt at each
		// backoff, and the file was given up in seconds.
		rt.timer.Stop()
		rt.wait = min(2*rt.wait, r.opts.RetryMax)
	} else {
		r.stopRetryLocked(f)
		rt = &retry{sha: sha, gen: r.gen, wait: r.opts.RetryMin}
		f.retry = rt
	}
	if rt.attempts++; rt.attempts >= r.opts.RetryAttempts {
		// A deadline that passes at every attempt is as likely a guest
		// that never ends its start as a busy machine: each attempt
		// costs a core for the load's timeout, so it stops.
		r.stopRetryLocked(f)
		return r.fail(f, fmt.Errorf("%w (failed %d times in a row, for a reason that may pass; tried again when the file or the configuration changes)", err, rt.attempts))
	}
	path := f.status.Path
	rt.timer = time.AfterFunc(rt.wait, func() { r.retryDue(path, rt) })
	f.status.State, f.status.Error = StateRetrying, err.Error()
	f.status.RetryAt = time.Now().Add(rt.wait)
	// Said once, not on each attempt: the status has the next one.
	if again {
		r.log.Debug("plugin load failed again for a reason that may pass", "path", path, "error", err, "retry_in", rt.wait)
	} else if f.plugin != nil {
		r.log.Warn("plugin version not loaded, for a reason that may pass: the old version goes on serving, and the new one is tried again, with backoff, until it loads or the file or the configuration changes",
			"path", path, "sha256", f.plugin.SHA256(), "error", err, "retry_in", rt.wait)
	} else {
		r.log.Warn("plugin not loaded, for a reason that may pass: tried again, with backoff, until it loads or its file or the configuration changes",
			"path", path, "error", err, "retry_in", rt.wait)
	}
	return err
}

// stopRetryLocked forgets f's retry, if any: it loaded, failed for good,
// went, or another version or configuration is being loaded. The caller
// holds r.mu.
func (r *Reloader) stopRetryLocked(f *fileState) {
	if f.retry == nil {
		return
	}
	if f.retry.timer != nil { // nil when given up at its first failure
		f.retry.timer.Stop()
	}
	f.retry = nil
	f.status.RetryAt = time.Time{}
}

// retryDue rescans for the file at path, whose retry rt is due, unless
// rt was stopped meanwhile or the reloader is closing. The rescan is the
// ordinary one (one at a time, collisions and order as ever): the file's
// failed bytes are no longer skipped, and the files that did not change
// are not loaded again.
func (r *Reloader) retryDue(path string, rt *retry) {
	r.mu.Lock()
	f := r.files[path]
	if r.closing || r.cat == nil || f == nil || f.retry != rt {
		r.mu.Unlock()
		return
	}
	f.lastBad, f.collided = "", false
	r.retries.Add(1)
	r.mu.Unlock()
	defer r.retries.Done()
	if _, errs := r.Rescan(r.ctx); len(errs) > 0 {
		r.log.Debug("retry rescan finished with errors", "errors", len(errs))
	}
}
