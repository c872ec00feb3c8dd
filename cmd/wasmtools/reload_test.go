package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

func TestHotReloadOverStdio(t *testing.T) {
	dir := t.TempDir()
	changed := make(chan struct{}, 10)
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if res, err := cs.ListTools(context.Background(), nil); err != nil || len(res.Tools) != 0 {
		t.Fatalf("empty folder: %v %v", res, err)
	}
	// Deploy the safe way: write elsewhere, rename in. The server's watch
	// may not have started yet, and gives no sign when it has: a rename
	// before then is never seen, so deploy again each second until the
	// tool list changes. The same bytes again change nothing.
	deadline := time.Now().Add(startupTimeout)
	for deployed := false; !deployed; {
		tmp := filepath.Join(dir, ".counter.wasm.tmp")
		os.WriteFile(tmp, testplugins.Bytes(t, testplugins.Example(t, "counter")), 0o644)
		os.Rename(tmp, filepath.Join(dir, "counter.wasm"))
		select {
		case <-changed:
			deployed = true
		case <-time.After(time.Second):
			if time.Now().After(deadline) {
				t.Fatalf("no tools/list_changed after a plugin was renamed in\n%s", stderr.String())
			}
		}
	}
	if got := callText(t, cs, "count", nil); got != "1" {
		t.Errorf("count = %s", got)
	}
	// A bad file never takes the good one down.
	os.WriteFile(filepath.Join(dir, "counter.wasm"), []byte("garbage"), 0o644)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("the old version goes on serving")) {
		t.Fatalf("the bad version was not reported:\n%s", stderr.String())
	}
	if got := callText(t, cs, "count", nil); got != "2" {
		t.Errorf("count after a bad deploy = %s, want 2 (the old version, its state kept)", got)
	}
}

func TestStatus(t *testing.T) {
	// hash (a plugin with tools to report), counter and a broken file:
	// the example folder's other Go plugins would add only seconds of
	// loading each under the race detector.
	dir := testplugins.Folder(t, map[string]string{
		"hash.wasm":    testplugins.Example(t, "hash"),
		"counter.wasm": testplugins.Example(t, "counter"),
	})
	os.WriteFile(filepath.Join(dir, "broken.wasm"), []byte("nope"), 0o644)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr lockedBuffer
	go run(ctx, []string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr, dir}, nil, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	// Ready once serving, and the plugins' first load is done: both logged.
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("serving MCP over streamable HTTP", "plugins loaded")) {
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"status", "--url", "http://" + addr, "--json"}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s\n%s", code, errb.String(), stderr.String())
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, p := range rep.Plugins {
		states[p.Name] = p.State
		if p.Name == "hash" && (len(p.SHA256) != 64 || strings.Join(p.Tools, ",") != "base64,hash" || p.LastReload.IsZero()) {
			t.Errorf("hash: %+v", p)
		}
		if p.Name == "broken" && !strings.Contains(p.Error, "not a WebAssembly module") {
			t.Errorf("broken: %+v", p)
		}
	}
	if states["hash"] != "loaded" || states["counter"] != "loaded" || states["broken"] != "error" || len(states) != 3 {
		t.Errorf("states = %v", states)
	}
	out.Reset()
	if code := run(ctx, []string{"status", "--url", "http://" + addr + "/mcp"}, nil, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "PLUGIN") || !strings.Contains(out.String(), "broken (") {
		t.Errorf("status table (exit %d):\n%s", code, out.String())
	}
	if code := run(ctx, []string{"status", "--url", "http://127.0.0.1:1"}, nil, nil, &out, &errb); code != 1 {
		t.Errorf("status of nothing: exit %d", code)
	}
}
