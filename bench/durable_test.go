package bench

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// durablePlugins are the two plugins of benchPlugins, each called with a
// tool that changes its instance's state at every call, so that every
// call writes a checkpoint: the small plugin's count, and the Go plugin's
// var_count (an Extism var, which the saved state carries; its echo may
// leave the state as it was, and then nothing is written).
var durablePlugins = []plugin{
	benchPlugins[0],
	{
		name:   "go",
		path:   benchPlugins[1].path,
		tool:   "var_count",
		args:   map[string]any{},
		want:   "1",
		counts: true,
	},
}

// durableKey is the state key every host of BenchmarkDurableCall shares.
var durableKey = []byte("bench state key, shared by the replicas of BenchmarkDurableCall")

// callsBeforeMove is how many calls a moved session made on its first
// replica.
const callsBeforeMove = 2

// agedAfter is how many calls redis-aged's session makes before its timed
// ones: the servlet's memory then holds about four times the pieces it
// owns after the report's 600 or so calls.
const agedAfter = 3000

// aged is redis-aged's host and session, made on its first run and kept
// for the next (a benchmark runs its function more than once).
var aged struct {
	h  *host.Host
	cs *mcp.ClientSession
}

// agedCalls is redis-aged: warm calls of p on a session that made
// agedAfter calls first, untimed, on a host with the Redis store. The
// host and session are parent's (the whole benchmark's), so that they
// outlive each run of b.
func agedCalls(ctx context.Context, parent, b *testing.B, p plugin, path, redisURL, redisAddr string) {
	if aged.cs == nil {
		h := newHostWith(parent, &host.Options{Store: openStore(parent, redisURL), Replica: "aged", StateKey: durableKey}, path)
		srv := httptest.NewServer(h.HTTPHandler())
		parent.Cleanup(srv.Close)
		cs := connectStateful(ctx, parent, srv.URL, nil)
		parent.Cleanup(func() { cs.Close(); aged.h, aged.cs = nil, nil })
		n := agedAfter
		if testing.Short() {
			n = 50 // bench-short: that it runs, not its figures
		}
		for range n {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: p.tool, Arguments: p.args}); err != nil {
				b.Fatal(err)
			}
		}
		aged.h, aged.cs = h, cs
	}
	// warmCalls checks that the count goes on from the session's.
	res, err := aged.cs.CallTool(ctx, &mcp.CallToolParams{Name: p.tool, Arguments: p.args})
	if err != nil {
		b.Fatal(err)
	}
	var text string
	if tc, ok := res.Content[0].(*mcp.TextContent); ok && !res.IsError {
		text = tc.Text
	}
	n, _ := strconv.Atoi(text)
	if n <= 1 {
		b.Fatalf("the aged session's count is %q, want its calls before", text)
	}
	p.want = strconv.Itoa(n + 1)
	before := checkpointMetrics(aged.h)
	cpu := redisCPU(b, redisAddr)
	warmCalls(ctx, b, aged.cs, p, false)
	reportCheckpointsSince(b, aged.h, before)
	used := redisCPU(b, redisAddr) - cpu
	b.ReportMetric(float64(used.Microseconds())/float64(b.N+1), "redis-cpu-us")
}

// BenchmarkDurableCall measures what durable sessions (issue 16) cost:
// a checkpoint at every call, and the first call of a session on a
// replica that did not serve it before. Every call is a warm call over
// streamable HTTP on 127.0.0.1, on a stateful session (protocol
// 2025-11-25), of a tool that changes its instance's state
// (durablePlugins), under the default checkpoint policy (after each call),
// and every result is checked as BenchmarkWarmCall does.
//
// Contenders, in each plugin's case:
//   - no-store: the host without a state store. The baseline:
//     BenchmarkWarmCall's http/wasmtools with these tools.
//   - redis: the host with a store in a real redis-server on loopback,
//     started once: every call checks its claim (contained plugins, as both
//     here are: in the fenced write itself) and writes the
//     instance's saved state (sealed) to Redis before its result is sent.
//   - redis-wait: redis with a replica, every write waiting for it
//     (wait_replicas=1: Redis's WAIT after each write, on its connection),
//     a primary and replica of their own on loopback, so that redis's
//     primary replicates to no one.
//   - file: the same with the file store (bbolt, an fsync per write).
//   - adopt: the first call on replica B of a session whose earlier
//     calls (callsBeforeMove) ran on replica A, the two sharing the Redis
//     store and the state key. Before each timed call A drained (a
//     rolling restart: its instances saved, its claims released) and the
//     client's HTTP transport points at B; the timed call includes B's
//     takeover: reading the record, replaying initialize, claiming the
//     session, restoring the instance from its saved state, the call, and
//     its checkpoint. Its result must be the count A's calls left plus
//     one.
//   - adopt-killed: the same after A is gone as a replica killed (its
//     listener and connections closed, the host closed without a drain,
//     its sessions still claimed by A): B's claim waits out A's lease
//     (statestore.Lease), which is what keeps a stopped replica's serving
//     from memory sound (docs/DEPLOY.md, guarantees).
//   - first-call-no-store: the first call of a new session on the host
//     without a store, which makes the session's instance. With no-store,
//     what adopt is compared with.
//   - redis-aged (the Go plugin only): redis on a session that made
//     agedAfter calls first, untimed, so that its Go heap has spread as a
//     long session's does (the guest's runtime owns more and more of its
//     memory until its first collections): the snapshot has more pieces
//     to tell the written ones from, and its record more frames.
//
// adopt, adopt-killed and first-call-no-store connect a new client session for each
// call, untimed, without the standalone SSE stream, so that no GET of the
// client reaches the host during the timed call (a reconnecting stream
// would take the session over at B before the call). B/checkpoint is the
// mean size of one instance's saved state as written (before sealing),
// and write-us the mean time of its write (sealing and the store's put;
// not the snapshot, nor the claim), from the host's metrics.
func BenchmarkDurableCall(b *testing.B) {
	ctx := context.Background()
	redisAddr := proxytest.StartRedis(b)
	redisURL := "redis://" + redisAddr + "/0"
	waitPrimary := proxytest.StartRedis(b)
	proxytest.StartRedisReplica(b, waitPrimary)
	for _, p := range durablePlugins {
		path := p.path(b)
		plain := httptest.NewServer(newHost(b, path).HTTPHandler())
		b.Cleanup(plain.Close)
		b.Run(p.name+"/no-store", func(b *testing.B) {
			cs := connectStateful(ctx, b, plain.URL, nil)
			defer cs.Close()
			warmCalls(ctx, b, cs, p, false)
		})
		stores := []struct{ name, url string }{
			{"redis", redisURL},
			{"redis-wait", "redis://" + waitPrimary + "/0?wait_replicas=1"},
			{"file", "file:" + filepath.Join(b.TempDir(), "s.db")},
		}
		for _, s := range stores {
			b.Run(p.name+"/"+s.name, func(b *testing.B) {
				h := newHostWith(b, &host.Options{Store: openStore(b, s.url), Replica: "b1", StateKey: durableKey}, path)
				srv := httptest.NewServer(h.HTTPHandler())
				b.Cleanup(srv.Close)
				cs := connectStateful(ctx, b, srv.URL, nil)
				defer cs.Close()
				var before time.Duration
				if s.name == "redis" {
					before = redisCPU(b, redisAddr)
				}
				warmCalls(ctx, b, cs, p, false)
				reportCheckpoints(b, h)
				if s.name == "redis" {
					// warmCalls makes one call before its timed ones.
					used := redisCPU(b, redisAddr) - before
					b.ReportMetric(float64(used.Microseconds())/float64(b.N+1), "redis-cpu-us")
				}
			})
		}
		if p.name == "go" {
			parent := b
			b.Run(p.name+"/redis-aged", func(b *testing.B) {
				agedCalls(ctx, parent, b, p, path, redisURL, redisAddr)
			})
		}
		b.Run(p.name+"/adopt", func(b *testing.B) {
			adoptCalls(ctx, b, p, path, redisURL, true)
		})
		b.Run(p.name+"/adopt-killed", func(b *testing.B) {
			adoptCalls(ctx, b, p, path, redisURL, false)
		})
		b.Run(p.name+"/first-call-no-store", func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				cs := connectStateful(ctx, b, plain.URL, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
				b.StartTimer()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: p.tool, Arguments: p.args})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if _, err := p.check(res, ""); err != nil {
					b.Fatal(err)
				}
				cs.Close()
				b.StartTimer()
			}
		})
	}
}

// adoptCalls is BenchmarkDurableCall's adopt (drained) and adopt-killed:
// each timed call is the first at replica B of a session made at a
// replica A gone since, drained or killed.
func adoptCalls(ctx context.Context, b *testing.B, p plugin, path, storeURL string, drained bool) {
	// B lives through the benchmark; a new A (a new host on the same
	// compiled plugins, a new listener) serves each session's first
	// calls.
	hb := newHostWith(b, &host.Options{Store: openStore(b, storeURL), Replica: "b1", StateKey: durableKey}, path)
	srvB := httptest.NewServer(hb.HTTPHandler())
	b.Cleanup(srvB.Close)
	catA := loadCatalogue(b, path)
	storeA := openStore(b, storeURL)
	want := strconv.Itoa(callsBeforeMove)
	for b.Loop() {
		b.StopTimer()
		ha := host.New(plugins.NewStatic(catA), &host.Options{Store: storeA, Replica: "a1", StateKey: durableKey})
		srvA := httptest.NewServer(ha.HTTPHandler())
		rt := &movable{}
		rt.point(srvA.URL)
		cs := connectStateful(ctx, b, srvA.URL, &mcp.StreamableClientTransport{HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true})
		prev := ""
		for range callsBeforeMove {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: p.tool, Arguments: p.args})
			if err != nil {
				b.Fatal(err)
			}
			if prev, err = p.check(res, prev); err != nil {
				b.Fatalf("at A: %v", err)
			}
		}
		if prev != want {
			b.Fatalf("at A: count %s after %d calls", prev, callsBeforeMove)
		}
		if drained {
			// A drained, as in a rolling restart: its instances saved,
			// its claims released, the host closed.
			if err := ha.Drain(ctx, host.DrainOptions{}); err != nil {
				b.Fatal(err)
			}
			srvA.CloseClientConnections()
			srvA.Close()
		} else {
			// A is gone, as a replica killed: its connections and
			// listener closed, the host closed without a drain (its
			// sessions stay in the store, claimed by A).
			srvA.CloseClientConnections()
			srvA.Close()
			if err := ha.Close(ctx); err != nil {
				b.Fatal(err)
			}
		}
		rt.point(srvB.URL)
		b.StartTimer()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: p.tool, Arguments: p.args})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := p.check(res, prev); err != nil {
			b.Fatalf("at B: %v", err)
		}
		if res.Meta[host.MetaStateReset] != nil {
			b.Fatalf("at B: state reset: %v", res.Meta)
		}
		cs.Close() // DELETE at B: the session ends, its record goes
		b.StartTimer()
	}
	reportCheckpoints(b, hb)
}

// connectStateful connects a client session of protocol 2025-11-25 to
// the streamable HTTP endpoint at url, with tr's options (nil: the
// defaults), and checks the protocol negotiated. The caller closes the
// session.
func connectStateful(ctx context.Context, b *testing.B, url string, tr *mcp.StreamableClientTransport) *mcp.ClientSession {
	b.Helper()
	if tr == nil {
		tr = &mcp.StreamableClientTransport{}
	}
	tr.Endpoint = url
	cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: statefulProtocol})
	if err != nil {
		b.Fatal(err)
	}
	if v := cs.InitializeResult().ProtocolVersion; v != statefulProtocol {
		cs.Close()
		b.Fatalf("negotiated %s, want %s", v, statefulProtocol)
	}
	return cs
}

// openStore opens the state store at url with durableKey, closed when
// the benchmark ends (after the hosts made later, which close first).
func openStore(b *testing.B, url string) statestore.Store {
	b.Helper()
	s, err := statestore.Open(url, durableKey)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// movable is a proxy in a benchmark: it sends every request to the
// server it points at now, as a proxy whose rule moved would.
type movable struct{ to atomic.Pointer[url.URL] }

func (m *movable) point(base string) {
	u, err := url.Parse(base)
	if err != nil {
		panic(err)
	}
	m.to.Store(u)
}

func (m *movable) RoundTrip(r *http.Request) (*http.Response, error) {
	u := m.to.Load()
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, u.Host
	return http.DefaultTransport.RoundTrip(r)
}

// reportCheckpoints reports, from h's metrics, the mean size of the
// checkpoints it wrote so far (B/checkpoint) and the mean time of their
// writes to the store (write-us), and fails if it wrote none.
func reportCheckpoints(b *testing.B, h *host.Host) {
	b.Helper()
	reportCheckpointsSince(b, h, nil)
}

// reportCheckpointsSince is reportCheckpoints of the checkpoints written
// since h's metrics were before (nil: since it started), and returns the
// metrics now.
func reportCheckpointsSince(b *testing.B, h *host.Host, before map[string]float64) map[string]float64 {
	b.Helper()
	m := checkpointMetrics(h)
	n := m["wasmtools_checkpoint_bytes_count"] - before["wasmtools_checkpoint_bytes_count"]
	if n == 0 {
		b.Fatal("the host wrote no checkpoint")
	}
	b.ReportMetric((m["wasmtools_checkpoint_bytes_sum"]-before["wasmtools_checkpoint_bytes_sum"])/n, "B/checkpoint")
	b.ReportMetric((m["wasmtools_checkpoint_write_seconds_sum"]-before["wasmtools_checkpoint_write_seconds_sum"])/n*1e6, "write-us")
	return m
}

// checkpointMetrics returns h's metrics of checkpoints, by name.
func checkpointMetrics(h *host.Host) map[string]float64 {
	rec := httptest.NewRecorder()
	h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "wasmtools_checkpoint_") {
			continue
		}
		m[name], _ = strconv.ParseFloat(v, 64)
	}
	return m
}

// redisCPU returns the CPU time the redis-server at addr has used so far
// (INFO cpu: used_cpu_user and used_cpu_sys, in seconds to the
// microsecond), so that a benchmark can say what the store's own work
// was, apart from the time its client waited for it on a shared machine.
// It counts all of Redis's work meanwhile: the other clients are the
// replicas' heartbeats, one every 2 s each, a few µs a second.
func redisCPU(b *testing.B, addr string) time.Duration {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("INFO cpu\r\n")); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		b.Fatalf("INFO cpu: answered %q, %v", head, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		b.Fatalf("INFO cpu: answered %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		b.Fatal(err)
	}
	var used time.Duration
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name != "used_cpu_user" && name != "used_cpu_sys" {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu: %s is %q", name, v)
		}
		used += time.Duration(sec * float64(time.Second))
		found++
	}
	if found != 2 {
		b.Fatalf("INFO cpu: no used_cpu_user and used_cpu_sys in %q", body)
	}
	return used
}
