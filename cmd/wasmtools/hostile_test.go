package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// stderrTally counts the lines a subprocess writes to stderr that contain
// each of its markers, keeping only the first 64 KiB, so that a flood does
// not make the test hold it all.
type stderrTally struct {
	mu      sync.Mutex
	markers []string
	n       map[string]int
	head    []byte
	part    []byte // the unfinished last line
}

func (s *stderrTally) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if room := 64<<10 - len(s.head); room > 0 {
		s.head = append(s.head, p[:min(room, len(p))]...)
	}
	s.part = append(s.part, p...)
	for {
		i := bytes.IndexByte(s.part, '\n')
		if i < 0 {
			break
		}
		for _, m := range s.markers {
			if bytes.Contains(s.part[:i], []byte(m)) {
				if s.n == nil {
					s.n = map[string]int{}
				}
				s.n[m]++
			}
		}
		s.part = s.part[i+1:]
	}
	s.part = append([]byte(nil), s.part...)
	return len(p), nil
}

func (s *stderrTally) count(marker string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[marker]
}

// TestHostileStdioFloodsStdout: over stdio, the process's stdout is the
// MCP transport. A guest writing megabytes to its stdout and stderr, in
// calls running alongside other calls of the same session, must reach the
// log on stderr, rate-limited (a burst of 20 lines, then 50 a second, the
// rest counted), and never the transport.
func TestHostileStdioFloodsStdout(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"servlet.wasm": testplugins.Test(t, "servlet"),
		"counter.wasm": testplugins.Example(t, "counter"),
	})
	const stdoutLine, dropped = `msg="guest stdout"`, "dropped by the rate limit"
	stderr := &stderrTally{markers: []string{stdoutLine, dropped}}
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	cmd.Stderr = stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\nstderr:\n%s", err, stderr.head)
	}
	defer cs.Close()

	// 3 floods of 5,000 lines (1.5 MB in all): 15,000 lines, past what
	// the rate lets through in any run shorter than 5 minutes, so an
	// unlimited log fails the bound below as surely as with more lines,
	// which under the race detector only cost seconds of host-side line
	// handling.
	const floods, lines = 3, 5000
	flood := strings.Repeat(strings.Repeat("x", 100)+"\n", lines)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range floods {
		wg.Go(func() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "print", Arguments: map[string]any{"text": flood}})
			if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "printed" {
				t.Errorf("flood %d: %v %+v", i, err, res)
			}
		})
	}
	// The same session's calls to another plugin are served meanwhile.
	for i := 1; i <= 20; i++ {
		if got := callText(t, cs, "count", nil); got != strconv.Itoa(i) {
			t.Errorf("count during the floods = %s, want %d", got, i)
		}
	}
	wg.Wait()
	took := time.Since(start)
	if got := callText(t, cs, "echo", map[string]any{"text": "still talking"}); got != "still talking" {
		t.Errorf("echo after the floods = %q", got)
	}
	cs.Close() // waits for the process, and so for all it wrote to stderr
	// The floods reach the log as lines, as many as the rate allows.
	n, max := stderr.count(stdoutLine), int(20+50*took.Seconds())+5
	if n < 1 || n > max {
		t.Errorf("%d guest stdout lines on stderr in %v, want 1 to %d", n, took, max)
	}
	if stderr.count(dropped) < 1 {
		t.Errorf("the dropped lines were not counted on stderr:\n%s", stderr.head)
	}
}

// TestHostileRecordLogRotates: a plugin writing records as fast as it may
// (issue 12: 1 MiB of records per call added 50 MiB to the record log in
// 4 s) must not grow the record log without bound: it is rotated at
// --record-log-max, keeping one older file, and lines are never split.
func TestHostileRecordLogRotates(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"hostileflood.wasm": testplugins.Test(t, "hostileflood"),
		"counter.wasm":      testplugins.Example(t, "counter"),
	})
	const max = 256 << 10
	file := filepath.Join(t.TempDir(), "records.jsonl")
	var stderr lockedBuffer
	cs := connectStdio(t, &stderr, "--record-log", file, "--record-log-max", "256KiB", dir)
	defer func() {
		if t.Failed() {
			t.Logf("stderr:\n%.4000s", stderr.String())
		}
	}()
	// connectStdio waited for "plugins loaded": the first load is done,
	// every plugin served.
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil || !slices.ContainsFunc(res.Tools, func(tl *mcp.Tool) bool { return tl.Name == "records_burst" }) || len(res.Tools) != 13 {
		t.Fatalf("once the plugins loaded: tools %v, %v; want 13 with records_burst", res, err)
	}
	// Each call's line is about 1 MiB, past max alone: 8 calls write
	// 8 MiB, over three times the bound below, which a log that is never
	// rotated (or not cut to one older file) exceeds; more calls only
	// cost race-instrumented JSON encoding.
	const calls = 8
	for i := 1; i <= calls; i++ {
		if got := callText(t, cs, "records_burst", nil); got != "ok" {
			t.Fatalf("records_burst = %q", got)
		}
		if got := callText(t, cs, "count", nil); got != strconv.Itoa(i) {
			t.Fatalf("count between the floods = %s, want %d", got, i)
		}
	}
	cs.Close() // waits for the process, and so for the record log
	total, lines := 0, 0
	for _, name := range []string{file, file + ".1"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(b, []byte("\n"))
		// A file holds at most max bytes, or one line that alone is over
		// it (a call's records, up to 1 MiB).
		if len(b) > max && n > 1 {
			t.Errorf("%s: %d bytes in %d lines; want at most %d, or one line", name, len(b), n, max)
		}
		for line := range bytes.Lines(b) {
			if !json.Valid(line) {
				t.Fatalf("%s: a line that is not JSON (split?): %.200s", name, line)
			}
		}
		total += len(b)
		lines += n
	}
	if total > 2*(1<<20+max) {
		t.Errorf("the record log takes %d bytes; want at most %d", total, 2*(1<<20+max))
	}
	if lines < 2 {
		t.Errorf("%d lines kept; want the last calls'", lines)
	}
}

// firstCall starts `wasmtools serve args...` over stdio and returns how
// long, from the process's start, its first call of the counter's count
// took to be answered, and the session.
func firstCall(t *testing.T, stderr *lockedBuffer, args ...string) (time.Duration, *mcp.ClientSession) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait}, args...)...)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	cmd.Stderr = stderr
	start := time.Now()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	t.Cleanup(func() { cs.Close() })
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}})
	took := time.Since(start)
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "1" {
		t.Fatalf("first call: %v %+v\n%s", err, res, stderr)
	}
	return took, cs
}

// TestHostileFolderServesTheGoodPlugin: a folder holding a good plugin
// beside ten hostile files (compile bombs, a spinning start function, a
// spinning _initialize, a spinning tool list, a 100 001-tool list, a
// symbolic link to /dev/zero, a FIFO, a module over the table limit)
// serves the good plugin's first call within 2 s of start over twice the
// time with the good plugin alone, measured in the same run; then each
// hostile file is refused with its reason, and the server goes on.
func TestHostileFolderServesTheGoodPlugin(t *testing.T) {
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	dir := t.TempDir()
	files := map[string][]byte{
		"counter.wasm":     counter,
		"bomb-loops.wasm":  testplugins.ModuleWithBody(testplugins.NestedLoops(50_000)),
		"bomb-blocks.wasm": testplugins.ModuleWithBody(testplugins.NestedBlocks(100_000)),
		"bomb-table.wasm":  testplugins.ModuleWithBody(testplugins.BrTable(1_000_000)),
		"spinstart.wasm":   testplugins.Bytes(t, testplugins.Test(t, "hostilestart")),
		"spininit.wasm":    testplugins.Bytes(t, testplugins.Test(t, "hostileinit")),
		"spinlist.wasm":    testplugins.Bytes(t, testplugins.Test(t, "hostilelist")),
		"manytools.wasm":   testplugins.Bytes(t, testplugins.Test(t, "hostilelist")),
		"bigmin.wasm":      testplugins.Bytes(t, testplugins.Test(t, "hostilebigmin")),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.wasm")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.wasm"), 0o644); err != nil {
		t.Fatal(err)
	}
	var many strings.Builder
	many.WriteString(`{"tools":[`)
	for i := range 100_001 {
		if i > 0 {
			many.WriteByte(',')
		}
		fmt.Fprintf(&many, `{"name":"t%d"}`, i) // 1.9 MB, as the red team's
	}
	many.WriteString(`]}`)
	lists := `prompts = '{"prompts":[]}', resources = '{"resources":[]}', templates = '{"resourceTemplates":[]}'`
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`
[plugins.spinlist]
config = { spin = "1", tools = '{"tools":[]}', %s }

[plugins.manytools]
config = { tools = '%s', %s }
`, lists, many.String(), lists)), 0o644)

	// The baseline: the same server and configuration, the good plugin
	// alone, now, on this machine.
	alone := t.TempDir()
	os.WriteFile(filepath.Join(alone, "counter.wasm"), counter, 0o644)
	var baseStderr lockedBuffer
	baseline, base := firstCall(t, &baseStderr, "--config", cfg, alone)
	base.Close()

	var stderr lockedBuffer
	took, cs := firstCall(t, &stderr, "--config", cfg, dir)
	t.Logf("first call: %v with ten hostile files, %v with the good plugin alone", took, baseline)
	// Loaded one after another, the three spinning files alone would hold
	// it 30 s (their load deadline each). In parallel, three spinning
	// guests still share the cores with the good plugin's load: the bound
	// is 2 s over twice the baseline (about 0.7 s against 0.3 s on an idle
	// machine).
	if bound := 2*baseline + 2*time.Second; took > bound {
		t.Errorf("first call took %v with ten hostile files beside the good plugin, over %v (2 s over twice %v alone)", took, bound, baseline)
	}
	// Every hostile file is refused with its reason; the server goes on.
	// A guest that spins past its load deadline may only have met a
	// busy machine: it is refused as retrying (a warning), not for good.
	reasons := map[string]string{
		"bomb-loops": "max_loops", "bomb-blocks": "max_nesting", "bomb-table": "max_br_table_targets",
		"spinstart": "", "spininit": "", "spinlist": "", "manytools": "2000", "bigmin": "",
		"zero": "not a regular file", "fifo": "not a regular file",
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded")) {
		t.Fatalf("the first load did not end:\n%s", stderr.String())
	}
	logs := stderr.String()
	for name, reason := range reasons {
		line := ""
		for _, l := range strings.Split(logs, "\n") {
			refused := strings.Contains(l, "level=ERROR") || strings.HasPrefix(name, "spin") && strings.Contains(l, "level=WARN") && strings.Contains(l, "may pass")
			if strings.Contains(l, name+".wasm") && refused {
				line = l
				break
			}
		}
		if line == "" || !strings.Contains(line, reason) {
			t.Errorf("%s: refusal %q, want one naming %q", name, line, reason)
		}
	}
	if got := callText(t, cs, "count", nil); got != "2" {
		t.Errorf("count after the load = %s, want 2", got)
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(res.Tools) != 1 {
		t.Errorf("tools: %v %v; want the counter's one", res, err)
	}
}
