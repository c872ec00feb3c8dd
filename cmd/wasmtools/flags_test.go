package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

func TestParseFlagsAnywhere(t *testing.T) {
	for _, c := range []struct {
		args []string
		http string
		json bool
		pos  []string
	}{
		{[]string{"--http", "a", "dir"}, "a", false, []string{"dir"}},
		{[]string{"dir", "--http", "a"}, "a", false, []string{"dir"}},
		{[]string{"d1", "--json", "d2", "--http=a"}, "a", true, []string{"d1", "d2"}},
		{[]string{"d1", "--", "--http", "x"}, "", false, []string{"d1", "--http", "x"}},
		{[]string{"--json", "--", "--"}, "", true, []string{"--"}},
		{nil, "", false, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		h := fs.String("http", "", "")
		j := fs.Bool("json", false, "")
		if err := parseFlags(fs, c.args); err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if *h != c.http || *j != c.json || !slices.Equal(fs.Args(), c.pos) && len(fs.Args())+len(c.pos) > 0 {
			t.Errorf("%q: http %q json %v positional %q; want %q %v %q", c.args, *h, *j, fs.Args(), c.http, c.json, c.pos)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := parseFlags(fs, []string{"dir", "--nosuch"}); err == nil {
		t.Error("an unknown flag after a path was taken")
	}
}

// TestFlagAfterFile: a user's `inspect FILE --json` (the README's order)
// prints JSON, not the usage.
func TestFlagAfterFile(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"inspect", testplugins.Example(t, "counter"), "--json"}, lookup(nil), nil, &out, &errb)
	var v map[string]any
	if code != 0 || json.Unmarshal(out.Bytes(), &v) != nil {
		t.Errorf("inspect FILE --json: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// TestServeFileURL: `serve file:///PATH` (hyper-mcp's way to name a local
// plugin) serves the file in place, as its path; NAME=file:///PATH names
// it (it was taken for a path "file:///…" and not found).
func TestServeFileURL(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter"), "versioned.wasm": testplugins.Test(t, "versioned")})
	url, stderr := serveInProcess(t, nil, "--no-watch", "--source-dir", t.TempDir(), "file://"+filepath.Join(dir, "counter.wasm"), "h=file://"+filepath.Join(dir, "versioned.wasm"))
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]pluginStatus
	deadline := time.Now().Add(startupTimeout)
	for {
		names := toolNames(t, cs)
		st = statusOf(t, url)
		if slices.Contains(names, "count") && slices.Contains(names, "version") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools %v, want count and version\n%s", names, stderr.String())
		}
		stderr.waitFor(time.Now().Add(time.Second), contains("plugin sources fetched"))
	}
	if _, ok := st["h"]; !ok {
		t.Errorf("status %v: want the named source as h", st)
	}
}

// TestServeFolderAbovePlugins: serving the folder above the plugins
// (examples/plugins for examples/plugins/dist) says so and names the
// subfolder that holds them; it said only "tools=0".
func TestServeFolderAbovePlugins(t *testing.T) {
	dist := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	root := filepath.Dir(dist)
	_, stderr := serveInProcess(t, nil, "--no-watch", root)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded")) {
		t.Fatalf("never loaded:\n%s", stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "not in its subfolders") || !strings.Contains(s, dist) {
		t.Errorf("no warning naming %s:\n%s", dist, s)
	}
}

// TestMisspeltPluginNameSaid: a configuration entry or --prefix naming no
// plugin served is said (a misspelt name left its grant or prefix
// unapplied without a word); a correct one is not.
func TestMisspeltPluginNameSaid(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte("[plugins.counterr]\nmemory_limit = \"32MiB\"\n[plugins.counter]\nmemory_limit = \"32MiB\"\n"), 0o644)
	_, stderr := serveInProcess(t, nil, "--no-watch", "--config", cfg, "--prefix", "nosuch=x_", dir)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded")) {
		t.Fatalf("never loaded:\n%s", stderr.String())
	}
	s := stderr.String()
	for _, want := range []string{`where=[plugins.counterr] plugin=counterr`, `where=--prefix plugin=nosuch`} {
		if !strings.Contains(s, want) {
			t.Errorf("no warning with %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "plugin=counter\n") || strings.Contains(s, "where=[plugins.counter] ") {
		t.Errorf("the served plugin's entry was warned of:\n%s", s)
	}
}

// TestFileSourceWatched: a file:// source in the configuration (hyper-mcp's
// local plugins) is copied into the store, and a change of the file is
// served, as a moved tag is (it waited for `wasmtools reload`).
func TestFileSourceWatched(t *testing.T) {
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	v2 := bytes.Replace(v1, []byte(`"v1"`), []byte(`"v2"`), 1)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "versioned.wasm")
	os.WriteFile(plugin, v1, 0o644)
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfg, []byte("[plugins.v]\nsource = \"file://"+plugin+"\"\n"), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfg, "--source-dir", t.TempDir())
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	version := func() string {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "version"})
		if err != nil || res.IsError || len(res.Content) == 0 {
			return ""
		}
		return res.Content[0].(*mcp.TextContent).Text
	}
	for deadline := time.Now().Add(startupTimeout); version() != "v1"; {
		if time.Now().After(deadline) {
			t.Fatalf("v1 never served:\n%s", stderr.String())
		}
		stderr.waitFor(time.Now().Add(time.Second), contains("plugin sources fetched"))
	}
	tmp := filepath.Join(dir, ".versioned.wasm.tmp")
	os.WriteFile(tmp, v2, 0o644)
	os.Rename(tmp, plugin)
	for deadline := time.Now().Add(startupTimeout); version() != "v2"; {
		if time.Now().After(deadline) {
			t.Fatalf("the changed file was not served:\n%s", stderr.String())
		}
		stderr.waitFor(time.Now().Add(time.Second), contains("plugins compiled and swapped in"))
	}
}
