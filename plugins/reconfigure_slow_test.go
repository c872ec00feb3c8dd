package plugins_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestReconfigureSlowLoadAppliesNewOptions: a plugin whose load runs past
// SlowLoad is stopped and loaded again in the same rescan. Under a new
// configuration, that second attempt must load it under the new options,
// not find the version loaded under the old ones "served" (f.gen was set
// by the first attempt; servedGen is not checked).
func TestReconfigureSlowLoadAppliesNewOptions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "slowstart.wasm"), testplugins.Bytes(t, testplugins.Test(t, "slowstart")))
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}, SlowLoad: time.Microsecond})
	defer r.Close(ctx)
	if _, errs := r.Load(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	old := r.Catalogue().Plugins()
	if len(old) != 1 {
		t.Fatalf("served %d plugins", len(old))
	}
	r.Reconfigure(ctx, func(string) plugins.Options { return plugins.Options{Prefix: "new_"} }, nil)
	ps := r.Catalogue().Plugins()
	if len(ps) != 1 || ps[0] == old[0] {
		t.Fatalf("after Reconfigure the version loaded under the old options is still served (status %+v)", r.Status())
	}
	for _, tool := range r.Catalogue().Tools() {
		if !strings.HasPrefix(tool.Name, "new_") {
			t.Errorf("tool %q served without the new configuration's prefix", tool.Name)
		}
	}
}
