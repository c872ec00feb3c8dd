package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// BenchmarkReloadLatency (item 5): a new version of a plugin renamed into
// a folder `wasmtools serve` watches, until a client connected over the
// in-memory transport receives notifications/tools/list_changed. It
// includes the 25 ms settle time, compilation (from the on-disk cache,
// since the two versions alternate) and the go-sdk's 10 ms notification
// debounce. Neither alternative reloads at all (hyper-mcp) or within 2 s
// (wassette polls), so there is no baseline in the same run: issue 5 sets
// the bar, 50 ms for a small plugin. Reports the median as ms/reload.
func BenchmarkReloadLatency(b *testing.B) {
	small := testplugins.Bytes(b, testplugins.Test(b, "versioned"))
	goPlugin := testplugins.Bytes(b, testplugins.Example(b, "notes"))
	for _, tc := range []struct {
		name   string
		v1, v2 []byte
	}{
		{"small", small, bytes.Replace(small, []byte(`"v1"`), []byte(`"v2"`), 1)},
		// A second version of a Go plugin: the same code with a custom
		// section appended, so its bytes (and sha256) differ.
		{"go", goPlugin, append(append([]byte{}, goPlugin...), 0, 4, 2, 'v', '2', '!')},
	} {
		b.Run(tc.name+"/wasmtools", func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dir := b.TempDir()
			path := filepath.Join(dir, "plugin.wasm")
			os.WriteFile(path, tc.v1, 0o644)
			rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close(ctx)
			r := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: []string{dir}})
			if _, errs := r.Load(ctx); len(errs) > 0 {
				b.Fatal(errs)
			}
			h := host.New(r, nil)
			defer h.Close(ctx)
			go r.Watch(ctx)
			changed := make(chan struct{}, 16)
			st, ct := mcp.NewInMemoryTransports()
			if _, err := h.Server().Connect(ctx, st, nil); err != nil {
				b.Fatal(err)
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
			}).Connect(ctx, ct, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			time.Sleep(50 * time.Millisecond) // let the watch start
			var lat []time.Duration
			i := 0
			for b.Loop() {
				i++
				next := tc.v2
				if i%2 == 0 {
					next = tc.v1
				}
				tmp := filepath.Join(dir, ".plugin.tmp")
				os.WriteFile(tmp, next, 0o644)
				start := time.Now()
				os.Rename(tmp, path)
				select {
				case <-changed:
				case <-time.After(30 * time.Second):
					b.Fatal("no list_changed")
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				time.Sleep(20 * time.Millisecond) // let a trailing notification arrive
				for len(changed) > 0 {
					<-changed
				}
				b.StartTimer()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms/reload")
		})
	}
}
