package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// distinct returns wasm with a custom section naming i appended, so that
// copies of one hostile module are distinct files with distinct bytes.
func distinct(t *testing.T, path string, i int) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	name := "copy"
	payload := fmt.Sprintf("%d", i)
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, payload...)
	return append(append(b, 0, byte(len(body))), body...)
}

// TestFirstListBesideHostile: ten plugins that spin at load (five in
// their start function, five in their tool listing) and one merely slow
// to start beside a good one: a
// real wasmtools process over stdio answers its first tools/list with the
// good plugin's tools in about 1.4 s from the process's start on an idle
// machine (bounded at a few times what the good plugin took to load in a
// warm-up process, and at half the spinning ones' load timeout), without
// waiting for the spinning ones' load timeout: their loads are stopped
// after SlowLoad and done again later, and the slow one's tool follows
// with list_changed.
func TestFirstListBesideHostile(t *testing.T) {
	dir := t.TempDir()
	servlet, err := os.ReadFile(testplugins.Test(t, "servlet"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "servlet.wasm"), servlet, 0o644)
	slow, err := os.ReadFile(testplugins.Test(t, "slowstart"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "slowstart.wasm"), slow, 0o644)
	for i := range 5 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("spinstart%d.wasm", i)), distinct(t, testplugins.Test(t, "hostilestart"), i), 0o644)
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("spinlist%d.wasm", i)), distinct(t, testplugins.Test(t, "hostilelist"), i), 0o644)
	}
	// config writes the configuration, the spinning plugins' load timeout
	// spin (the other plugins' too, which load well within it).
	config := func(spin time.Duration) string {
		var cfg strings.Builder
		fmt.Fprintf(&cfg, "[defaults]\nload_timeout = %q\n", spin)
		// Its second load competes with the ten spinning ones' second
		// loads until their load timeout stops them: a load timeout of
		// its own beyond theirs, as an operator gives a plugin known to
		// start slowly (spin is at most a minute).
		cfg.WriteString("[plugins.slowstart]\nload_timeout = \"2m\"\n")
		for i := range 5 {
			fmt.Fprintf(&cfg, "[plugins.spinlist%d]\nconfig = { spin = \"1\" }\n", i)
		}
		path := filepath.Join(t.TempDir(), "wasmtools.toml")
		os.WriteFile(path, []byte(cfg.String()), 0o644)
		return path
	}

	// A warm compile cache, as in production after the first start: the
	// measure is of the load, not of the compiler. The warm-up ends once
	// servlet, the Go plugin, is loaded and every other file (a few
	// hundred bytes of WAT each, compiled in milliseconds) loaded or
	// stopped as slow to load, not at the end of the load, which waits
	// for the spinning plugins' load timeouts while they hold the cores.
	// It measures the baseline too: how long the good plugin took to be
	// loaded beside the others, on this machine, in this run.
	var warm lockedBuffer
	warmCmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--config", config(sandbox.DefaultLoadTimeout), dir)
	warmCmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	warmCmd.Stderr = &warm
	warmStart := time.Now()
	warmCS, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: warmCmd}, nil)
	if err != nil {
		t.Fatalf("warm-up: connect: %v\n%s", err, warm.String())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	compiled := func(s string) bool {
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			loaded := strings.Contains(s, "plugin loaded\" plugin="+strings.TrimSuffix(e.Name(), ".wasm")+" path="+path)
			stopped := strings.Contains(s, "plugin slow to load: stopped, and loaded again once the others are in\" path="+path)
			if !loaded && (e.Name() == "servlet.wasm" || !stopped) {
				return false
			}
		}
		return true
	}
	good := "plugin loaded\" plugin=servlet path=" + filepath.Join(dir, "servlet.wasm")
	if !warm.waitFor(time.Now().Add(startupTimeout), contains(good)) {
		t.Fatalf("warm-up: the good plugin was not loaded:\n%s", warm.String())
	}
	baseline := time.Since(warmStart)
	if !warm.waitFor(time.Now().Add(startupTimeout), compiled) {
		t.Fatalf("warm-up: not every plugin was compiled:\n%s", warm.String())
	}
	warmCS.Close() // waits for the process's exit

	// The first list must come in a few times the baseline (with a cold
	// cache the baseline counts the compiler too, which only loosens
	// the bound), and at least a few seconds, for a machine whose load
	// changes between the two processes. A list that waited for the
	// spinning plugins would come after their load timeout, or after
	// --load-wait if the load ends later: both at least twice the bound,
	// so that the test tells the two apart on any machine. Capped so
	// that their load timeout stays under slowstart's and the test's
	// length bounded on a very slow machine.
	bound := min(max(5*time.Second, (3*baseline).Round(time.Second)), 30*time.Second)
	spin := max(sandbox.DefaultLoadTimeout, 2*bound)
	var stderr lockedBuffer
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", spin.String(), "--config", config(spin), dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	cmd.Stderr = &stderr
	start := time.Now()
	changed := make(chan struct{}, 16)
	copts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.ListTools(context.Background(), nil)
	elapsed := time.Since(start)
	// What was logged when the first list was answered: the load may end
	// (and say "plugins loaded") while the test waits for the slow one.
	atFirstList := stderr.String()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	t.Logf("first tools/list %v after the process started: %d tools (the good plugin loaded after %v in the warm-up; bound %v, load timeout %v)", elapsed.Round(time.Millisecond), len(names), baseline.Round(time.Millisecond), bound, spin)
	if !slices.Contains(names, "echo") {
		t.Fatalf("first list %v: want the good plugin's tools\n%s", names, stderr.String())
	}
	// The plugin that is merely slow to start comes later, with
	// list_changed (over stdio).
	if slices.Contains(names, "late") {
		t.Logf("the slow plugin loaded within SlowLoad this time")
	}
	deadline := time.After(startupTimeout)
	for !slices.Contains(names, "late") {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no list_changed brought the slow plugin's tool: %v\n%s", names, stderr.String())
		}
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		names = names[:0]
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
		}
	}
	if elapsed >= bound {
		t.Errorf("first list after %v, want under %v (the good plugin loaded after %v in the warm-up; the spinning plugins' load timeout %v)\n%s", elapsed, bound, baseline, spin, stderr.String())
	}
	if strings.Contains(atFirstList, `msg="plugins loaded"`) {
		t.Errorf("the list waited for the spinning plugins' load timeout:\n%s", atFirstList)
	}
	if n := strings.Count(stderr.String(), "plugin slow to load"); n < 10 {
		t.Errorf("%d slow loads logged, want at least 10:\n%s", n, stderr.String())
	}
}
