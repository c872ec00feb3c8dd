package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// plugin is one of the two plugins every comparison is made on, and the
// call each benchmark makes to it.
type plugin struct {
	// name is the benchmark name element: "small" or "go".
	name string
	// path returns the built plugin file.
	path func(testing.TB) string
	// tool and args are the MCP call; input is the same call as the
	// servlet interface's input to the export "call", for the baselines
	// that call the guest directly.
	tool  string
	args  map[string]any
	input []byte
	// want is the text the first call returns; counts says each later
	// call on the same instance returns the previous number plus one.
	want   string
	counts bool
}

var echoText = strings.Repeat("x", 50)

// benchPlugins are the two plugins of issue 7: a small plugin (the
// 600-byte WAT counter, no runtime to initialise) and a Go plugin (the
// servlet test plugin, built with the Extism Go PDK and the standard Go
// toolchain, called with a 100-byte input).
var benchPlugins = []plugin{
	{
		name:   "small",
		path:   func(t testing.TB) string { return testplugins.Example(t, "counter") },
		tool:   "count",
		args:   map[string]any{},
		input:  []byte(`{"params":{"name":"count","arguments":{}}}`),
		want:   "1",
		counts: true,
	},
	{
		name:  "go",
		path:  func(t testing.TB) string { return testplugins.Test(t, "servlet") },
		tool:  "echo",
		args:  map[string]any{"text": echoText},
		input: []byte(`{"params":{"name":"echo","arguments":{"text":"` + echoText + `"}}}`),
		want:  echoText,
	},
}

// tmpDir holds what the benchmarks build (the native server binary); it is
// removed after the run.
var tmpDir string

func TestMain(m *testing.M) {
	var err error
	tmpDir, err = os.MkdirTemp("", "wasmtools-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmpDir)
	os.Exit(code)
}

var (
	nativeOnce sync.Once
	nativeBin  string
	nativeErr  error
)

// nativeServer returns the path of the process-per-session baseline, built
// on first use with `go build` from bench/internal/nativeserver.
func nativeServer(t testing.TB) string {
	t.Helper()
	nativeOnce.Do(func() {
		nativeBin = filepath.Join(tmpDir, "nativeserver")
		// bench is its own module: build from its folder.
		cmd := exec.Command("go", "build", "-o", nativeBin, "./internal/nativeserver")
		cmd.Dir = filepath.Join(testplugins.Root(), "bench")
		if out, err := cmd.CombinedOutput(); err != nil {
			nativeErr = fmt.Errorf("build nativeserver: %v\n%s", err, out)
		}
	})
	if nativeErr != nil {
		t.Fatal(nativeErr)
	}
	return nativeBin
}

// client is the go-sdk client every MCP benchmark connects with.
var client = mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)

// newHost serves the plugin files with wasmtools' defaults (compilation
// cached on disk, as `wasmtools serve` does), closed when the benchmark
// ends.
func newHost(t testing.TB, paths ...string) *host.Host {
	t.Helper()
	return newHostWith(t, nil, paths...)
}

// newHostWith is newHost with host options.
func newHostWith(t testing.TB, opts *host.Options, paths ...string) *host.Host {
	t.Helper()
	h := host.New(plugins.NewStatic(loadCatalogue(t, paths...)), opts)
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

// loadCatalogue compiles the plugin files in a new runtime, with
// compilation cached on disk; both are closed when the benchmark ends.
func loadCatalogue(t testing.TB, paths ...string) *plugins.Catalogue {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	cat, errs := plugins.LoadAll(ctx, rt, paths, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	return cat
}

// connectInMemory opens a client session to srv over the in-memory
// transport, negotiating the client's default protocol revision.
func connectInMemory(ctx context.Context, srv *mcp.Server) (*mcp.ClientSession, *mcp.ServerSession, error) {
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		return nil, nil, err
	}
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		ss.Close()
		return nil, nil, err
	}
	return cs, ss, nil
}

// process is one process-per-session server and its client session.
type process struct {
	cs  *mcp.ClientSession
	cmd *exec.Cmd
}

// startProcess starts the native server binary and connects a client
// session to it over stdio. Closing the session closes the server's stdin,
// and it exits.
func startProcess(ctx context.Context, bin string) (*process, error) {
	cmd := exec.Command(bin)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return nil, err
	}
	return &process{cs: cs, cmd: cmd}, nil
}

// callText makes one tool call and returns its text, failing on an error
// or an isError result.
func callText(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", fmt.Errorf("call %s: %w", tool, err)
	}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	text := strings.Join(parts, "\n")
	if res.IsError {
		return "", fmt.Errorf("call %s: tool error: %s", tool, text)
	}
	return text, nil
}

// readRSS returns this process's resident set size after a full GC that
// returns freed memory to the OS.
func readRSS(t testing.TB) int64 { return testplugins.RSS(t) }

// readPSS returns a process's proportional set size: its private pages
// plus its share of the pages it shares with other processes (the Go
// binary's text, shared by every server process), which is what one more
// process really costs.
func readPSS(t testing.TB, pid int) int64 {
	t.Helper()
	if pid == os.Getpid() {
		return testplugins.PSS(t) // after a GC
	}
	return procKiB(t, "/proc/"+strconv.Itoa(pid)+"/smaps_rollup", "Pss:") << 10
}

// procKiB reads a "Field:  N kB" line from a /proc file.
func procKiB(t testing.TB, path, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("memory benchmarks need Linux's /proc: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			if f := strings.Fields(v); len(f) > 0 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb
				}
			}
		}
	}
	t.Fatalf("%s: no %s line", path, field)
	return 0
}
