package plugins_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// retryReloader starts a Reloader over a new folder holding the file
// name with the bytes b, under opts (its Paths that folder), and closes
// it when the test ends. Each load attempt is sent on the channel given
// back (buffered: a test drains it), then opts.Check, if any, is asked.
func retryReloader(t *testing.T, name string, b []byte, opts plugins.ReloaderOptions) (*plugins.Reloader, chan struct{}) {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, name), b)
	attempts := make(chan struct{}, 1000)
	check := opts.Check
	opts.Paths = []string{dir}
	opts.Check = func(path string, b []byte) error {
		attempts <- struct{}{}
		if check == nil {
			return nil
		}
		return check(path, b)
	}
	r := plugins.NewReloader(newRuntime(t), opts)
	t.Cleanup(func() { r.Close(context.Background()) })
	return r, attempts
}

// hostileStart is the plugin whose start function never ends.
func hostileStart(t *testing.T) []byte {
	return testplugins.Bytes(t, testplugins.Test(t, "hostilestart"))
}

// loadTimesOut gives a plugin 50 ms to load: hostilestart runs out of
// it at every attempt, a failure that may pass.
func loadTimesOut(string) plugins.Options {
	policy := sandbox.NewPolicy().WithLoadTimeout(50 * time.Millisecond)
	return plugins.Options{Policy: &policy}
}

// TestReconfigureTransientFailureRetried: under a new configuration, a
// plugin whose load fails for a reason of the moment (its compilation
// ran out of time, as on a loaded machine) is dropped (the
// safety rule: not served under the old configuration's grants), and
// loaded again under the new configuration once the moment has passed,
// without waiting for its file or the configuration to change.
func TestReconfigureTransientFailureRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy sandbox.Policy
	}{
		{"compile timeout", sandbox.NewPolicy().WithCompileTimeout(time.Nanosecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			r, _ := retryReloader(t, "slowstart.wasm", testplugins.Bytes(t, testplugins.Test(t, "slowstart")), plugins.ReloaderOptions{})
			if _, errs := r.Load(ctx); len(errs) > 0 {
				t.Fatal(errs)
			}
			// The machine is loaded: the new configuration's loads run
			// out of time until it is not.
			var loaded atomic.Bool
			loaded.Store(true)
			r.Reconfigure(ctx, func(string) plugins.Options {
				if loaded.Load() {
					return plugins.Options{Prefix: "new_", Policy: &tc.policy}
				}
				return plugins.Options{Prefix: "new_"}
			}, nil)
			if n := len(r.Catalogue().Plugins()); n != 0 {
				t.Fatalf("after a failed load under the new configuration, %d plugins served under the old one", n)
			}
			if s := status(r, "slowstart"); s.State != plugins.StateRetrying || !strings.Contains(s.Error, "deadline exceeded") {
				t.Errorf("status after a load that ran out of time: state %q, error %q; want retrying, with the reason", s.State, s.Error)
			}
			loaded.Store(false)
			waitFor(t, "the plugin to be loaded again under the new configuration", func() bool {
				return status(r, "slowstart").State == plugins.StateLoaded
			})
			for _, tool := range r.Catalogue().Tools() {
				if !strings.HasPrefix(tool.Name, "new_") {
					t.Errorf("tool %q served without the new configuration's prefix", tool.Name)
				}
			}
		})
	}
}

// logCounter counts the log records at or above a level whose message
// holds a string.
type logCounter struct {
	level slog.Level
	mu    sync.Mutex
	msgs  []string
}

func (c *logCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= c.level }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.msgs = append(c.msgs, r.Message)
	c.mu.Unlock()
	return nil
}
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCounter) WithGroup(string) slog.Handler      { return c }

func (c *logCounter) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// TestTransientRetryBacksOffAndStopsOnClose: a load that keeps running
// out of time (a start function that spins past the load timeout, after
// the first pass of the rescan found it slow) is tried again and again, said once in the log (not on
// each attempt), its status retrying with the next attempt's time; Close
// stops it: no attempt runs after Close returns.
func TestTransientRetryBacksOffAndStopsOnClose(t *testing.T) {
	ctx := context.Background()
	logs := &logCounter{level: slog.LevelWarn}
	r, attempts := retryReloader(t, "hostilestart.wasm", hostileStart(t), plugins.ReloaderOptions{Logger: slog.New(logs), SlowLoad: 10 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond, OptionsFor: loadTimesOut})
	r.Load(ctx)
	for range 5 {
		select {
		case <-attempts:
		case <-time.After(waitTimeout):
			t.Fatalf("the load was not tried again (status %+v)", status(r, "hostilestart"))
		}
	}
	if s := status(r, "hostilestart"); s.State != plugins.StateRetrying || s.RetryAt.IsZero() || !strings.Contains(s.Error, "load timeout") {
		t.Errorf("status while retrying: %+v", s)
	}
	if n := logs.count("may pass"); n != 1 {
		t.Errorf("the transient failure was logged %d times over 5 attempts; want once (%q)", n, logs.msgs)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for len(attempts) > 0 {
		<-attempts // begun before Close returned
	}
	select {
	case <-attempts:
		t.Fatal("a retry ran after Close")
	case <-time.After(time.Second): // 25 times the longest backoff
	}
}

// TestTransientRetryGivesUp: a load that fails for a reason that may pass
// at every attempt (here a start function that never ends, which costs a
// core for the load's timeout at each) is given up after RetryAttempts,
// its status an error that says so, and not tried again.
func TestTransientRetryGivesUp(t *testing.T) {
	ctx := context.Background()
	r, attempts := retryReloader(t, "hostilestart.wasm", hostileStart(t), plugins.ReloaderOptions{SlowLoad: time.Minute,
		RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond, RetryAttempts: 3, OptionsFor: loadTimesOut})
	r.Load(ctx)
	waitFor(t, "the retries given up", func() bool { return status(r, "hostilestart").State == plugins.StateError })
	if s := status(r, "hostilestart"); !strings.Contains(s.Error, "failed 3 times") || !s.RetryAt.IsZero() {
		t.Errorf("status once given up: %+v", s)
	}
	for len(attempts) > 0 {
		<-attempts
	}
	select {
	case <-attempts:
		t.Fatal("the load was tried again after it was given up")
	case <-time.After(time.Second): // 50 times the longest backoff
	}
}

// TestPermanentFailureNotRetried: a load refused for what the file or
// the configuration is (the check refuses it; its bytes are not a
// module) is not tried again until one of them changes.
func TestPermanentFailureNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		check error
	}{
		{"refused by the check", nil, errors.New("does not match the pin")},
		{"not a module", []byte("not wasm"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			v1, _ := versions(t)
			b := tc.bytes
			if b == nil {
				b = v1
			}
			r, attempts := retryReloader(t, "versioned.wasm", b, plugins.ReloaderOptions{RetryMin: 10 * time.Millisecond,
				Check: func(string, []byte) error { return tc.check }})
			if _, errs := r.Load(ctx); len(errs) != 1 {
				t.Fatalf("load: %v", errs)
			}
			<-attempts
			if s := status(r, "versioned"); s.State != plugins.StateError || !s.RetryAt.IsZero() {
				t.Errorf("status: %+v; want error, no retry", s)
			}
			select {
			case <-attempts:
				t.Fatal("a load refused for good was tried again")
			case <-time.After(time.Second): // 100 times the backoff
			}
		})
	}
}

// TestRetryStopsWhenConfigurationChanges: a retrying load is given up
// when the configuration changes: the file is loaded under the new one
// at once, and here refused for good (the check), so not tried again.
func TestRetryStopsWhenConfigurationChanges(t *testing.T) {
	ctx := context.Background()
	r, attempts := retryReloader(t, "hostilestart.wasm", hostileStart(t), plugins.ReloaderOptions{SlowLoad: 10 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond, OptionsFor: loadTimesOut})
	r.Load(ctx)
	for range 3 {
		select {
		case <-attempts:
		case <-time.After(waitTimeout):
			t.Fatalf("the load was not tried again (status %+v)", status(r, "hostilestart"))
		}
	}
	r.Reconfigure(ctx, loadTimesOut, func(string, []byte) error { attempts <- struct{}{}; return errors.New("does not match the pin") })
	if s := status(r, "hostilestart"); s.State != plugins.StateError || !s.RetryAt.IsZero() || !strings.Contains(s.Error, "pin") {
		t.Fatalf("after a configuration that refuses it: %+v; want error, no retry", s)
	}
	for len(attempts) > 0 {
		<-attempts // begun before Reconfigure's rescan ended
	}
	select {
	case <-attempts:
		t.Fatal("the load was tried again after the configuration changed and refused it for good")
	case <-time.After(time.Second): // 25 times the longest backoff
	}
}
