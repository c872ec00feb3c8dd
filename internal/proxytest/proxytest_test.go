package proxytest_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// recorder is a testing.TB that records a Fatal or Skip and ends its
// goroutine, as the real ones do.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Skip(args ...any)  { r.skip = fmt.Sprint(args...); runtime.Goexit() }

// TestBinaryMissing: a missing server fails the test under CI and skips it
// elsewhere, naming the package to install.
func TestBinaryMissing(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			proxytest.Binary(r, "no-such-server-here", "no-such-package")
		}()
		<-done
		got, other := r.skip, r.fatal
		if ci != "" {
			got, other = r.fatal, r.skip
		}
		if !strings.Contains(got, "apt-get install no-such-package") || other != "" {
			t.Errorf("CI=%q: fatal %q, skip %q", ci, r.fatal, r.skip)
		}
	}
}
