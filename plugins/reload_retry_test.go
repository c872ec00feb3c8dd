package plugins_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

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
			dir := t.TempDir()
			write(t, filepath.Join(dir, "slowstart.wasm"), testplugins.Bytes(t, testplugins.Test(t, "slowstart")))
			r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
			defer r.Close(ctx)
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
			if s := status(r, "slowstart"); s.State != "retrying" || !strings.Contains(s.Error, "deadline exceeded") {
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

