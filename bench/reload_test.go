package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// Untimed, before the reloads measured: a first new version is deployed
// until its notification comes (the watch has started); the versions then
// alternate, and each reload is waited for by its own notification (see
// notified), with no fixed sleeps.
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

			// deploy renames version into the folder, as a deployment
			// does, and returns when.
			deploy := func(version []byte) time.Time {
				tmp := filepath.Join(dir, ".plugin.tmp")
				os.WriteFile(tmp, version, 0o644)
				start := time.Now()
				os.Rename(tmp, path)
				return start
			}
			// notified waits for the list_changed of the reload that
			// serves version, and returns when it arrived. A notification
			// is that reload's if the reloader serves version once it has
			// arrived: the host registers a new version's tools, which
			// arms the notification, under the reloader's lock, so Status
			// returns once that reload is wholly served. A notification
			// left over from the reload before (the go-sdk debounces
			// changes by 10 ms; a slow swap can send a second one) arrives
			// before this reload is served, and is skipped. retry, if not
			// zero, deploys version again that often until it is served.
			notified := func(version []byte, retry time.Duration) time.Time {
				want := sha256Hex(version)
				deadline := time.After(30 * time.Second)
				var again <-chan time.Time
				if retry > 0 {
					t := time.NewTicker(retry)
					defer t.Stop()
					again = t.C
				}
				for {
					select {
					case <-changed:
						at := time.Now()
						if served(b, r) == want {
							return at
						}
					case <-again:
						deploy(version)
					case <-deadline:
						b.Fatal("no list_changed")
					}
				}
			}
			// The watch is running and the client hears of reloads once a
			// first new version has been served and notified, untimed. A
			// rename made before the watch started is not seen: the probe
			// is deployed again every second until it is.
			cur := tc.v2
			deploy(cur)
			notified(cur, time.Second)

			var lat []time.Duration
			for b.Loop() {
				next := tc.v2
				if bytes.Equal(cur, tc.v2) {
					next = tc.v1
				}
				start := deploy(next)
				lat = append(lat, notified(next, 0).Sub(start))
				cur = next
				b.StopTimer()
				for len(changed) > 0 { // a trailing notification of this reload
					<-changed
				}
				b.StartTimer()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms/reload")
		})
	}
}

// served returns the sha256 of the version the reloader serves of its one
// plugin file.
func served(b *testing.B, r *plugins.Reloader) string {
	st := r.Status()
	if len(st) != 1 {
		b.Fatalf("%d plugin files, want 1: %+v", len(st), st)
	}
	return st[0].SHA256
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
