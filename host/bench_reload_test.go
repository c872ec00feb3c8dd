package host_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// BenchmarkReloadLatency: a new version of a plugin renamed into a watched
// folder, until a connected client (in memory) receives
// notifications/tools/list_changed; the settle time (25 ms), compilation
// (from the on-disk cache after the first time) and the SDK's 10 ms
// notification debounce included. Reports the median as ms/reload.
func BenchmarkReloadLatency(b *testing.B) {
	v1, v2 := versionBytes(b)
	notes := testplugins.Bytes(b, testplugins.Example(b, "notes"))
	for _, tc := range []struct {
		name   string
		v1, v2 []byte
	}{{"wat", v1, v2}, {"go", notes, withCustomSection(notes, "v2")}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dir := b.TempDir()
			path := filepath.Join(dir, "plugin.wasm")
			os.WriteFile(path, tc.v1, 0o644)
			rt, _ := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
			defer rt.Close(ctx)
			r := plugins.NewReloader(rt, plugins.ReloaderOptions{Paths: []string{dir}})
			cat, _ := r.Load(ctx)
			h := host.New(cat, nil)
			defer h.Close(ctx)
			r.OnSwap(func(_ context.Context, s plugins.Swap) { h.Swap(s) })
			go r.Watch(ctx)
			changed := make(chan struct{}, 16)
			st, ct := mcp.NewInMemoryTransports()
			h.Server().Connect(ctx, st, nil)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
			}).Connect(ctx, ct, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			time.Sleep(50 * time.Millisecond)
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
				time.Sleep(20 * time.Millisecond) // let the debounced notification settle
				for len(changed) > 0 {
					<-changed
				}
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms/reload")
		})
	}
}
