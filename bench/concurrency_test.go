package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/bench/internal/native"
)

// concurrencyLevels are the numbers of concurrent sessions of issue 7,
// item 4.
var concurrencyLevels = []int{1, 8, 64, 256}

// BenchmarkConcurrentSessions measures throughput and latency under load
// (issue 7, item 4): 1, 8, 64 and 256 client sessions, each with a warm
// instance, calling the Go plugin's echo (100-byte input) as fast as they
// get answers, all at once. Each op is one call, handed to whichever
// session is free; the benchmark reports calls/s and the p50 and p99
// latency of one call (client to result) in µs (p50-us, p99-us).
//
// Contenders:
//   - native: the tool as a native Go handler on a go-sdk server, sessions
//     over the in-memory transport. The baseline.
//   - wasmtools: the plugin served by wasmtools, sessions over the
//     in-memory transport, each session with its own instance.
//   - raw-wazero-tool: the plugin on plain wazero in a go-sdk tool, each
//     session with its own instance (rawToolServer): the floor of any Wasm
//     host on the go-sdk.
//   - process-per-session: one native server process per session, over
//     stdio.
//
// Clients and servers share the machine's cores (two, where issue 7's
// figures are taken), as they would on one host.
func BenchmarkConcurrentSessions(b *testing.B) {
	ctx := context.Background()
	bin := nativeServer(b)
	nsrv := native.NewServer()
	p := benchPlugins[1] // go
	h := newHost(b, p.path(b))
	rt := rawToolServer(ctx, b, p)
	type contender struct {
		name    string
		connect func() (*mcp.ClientSession, error)
	}
	contenders := []contender{
		{"native", func() (*mcp.ClientSession, error) {
			cs, _, err := connectInMemory(ctx, nsrv)
			return cs, err
		}},
		{"wasmtools", func() (*mcp.ClientSession, error) {
			cs, _, err := connectInMemory(ctx, h.Server())
			return cs, err
		}},
		{"raw-wazero-tool", func() (*mcp.ClientSession, error) {
			cs, _, err := connectInMemory(ctx, rt.srv)
			return cs, err
		}},
		{"process-per-session", func() (*mcp.ClientSession, error) {
			pr, err := startProcess(ctx, bin)
			if err != nil {
				return nil, err
			}
			return pr.cs, nil
		}},
	}
	for _, n := range concurrencyLevels {
		for _, c := range contenders {
			b.Run(fmt.Sprintf("sessions=%d/%s", n, c.name), func(b *testing.B) {
				sessions := make([]*mcp.ClientSession, n)
				defer func() {
					var wg sync.WaitGroup
					for _, cs := range sessions {
						if cs != nil {
							wg.Go(func() { cs.Close() })
						}
					}
					wg.Wait()
					rt.closeInstances(ctx)
				}()
				for i := range sessions {
					cs, err := c.connect()
					if err != nil {
						b.Fatal(err)
					}
					sessions[i] = cs
					if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
						b.Fatal(err)
					}
				}
				loadSessions(ctx, b, sessions, p)
			})
		}
	}
}

// loadSessions times b.N calls spread over the sessions, each session
// making one call at a time, and reports calls/s, p50-us and p99-us, and
// cpu-ns/op, this process's CPU time per call (clients and in-process
// servers; not process-per-session's server processes): on a shared
// machine it varies far less than calls/s.
func loadSessions(ctx context.Context, b *testing.B, sessions []*mcp.ClientSession, p plugin) {
	work := make(chan struct{})
	lat := make([][]time.Duration, len(sessions))
	errs := make(chan error, len(sessions))
	var wg sync.WaitGroup
	for i, cs := range sessions {
		wg.Go(func() {
			for range work {
				start := time.Now()
				if _, err := callText(ctx, cs, p.tool, p.args); err != nil {
					errs <- err
					for range work { // drain, so the loop below ends
					}
					return
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		})
	}
	var err error
	var t0 time.Time
	// The sessions' setup (an instance each, for wasmtools) leaves a
	// collection due: done now, untimed, for every contender alike, so
	// that the timed calls pay for their own garbage only.
	runtime.GC()
	cpu := startCPU()
	for b.Loop() {
		if t0.IsZero() {
			t0 = time.Now()
		}
		select {
		case work <- struct{}{}:
		case err = <-errs:
		}
		if err != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(t0) // the calls still running when the loop ended included
	cpu.report(b)
	if err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(q float64) float64 {
		return float64(all[int(q*float64(len(all)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
}
