package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// cacheFiles lists the files under dir.
func cacheFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestServePrepare: `serve --prepare` loads every plugin as serving would,
// prints what would be served and exits, leaving each plugin's machine
// code in the cache, under the key serving looks it up by: a server
// started on that cache afterwards compiles nothing. A file that fails
// makes it exit 1 and say why, the others prepared all the same.
//
// The plugins are small ones: hash, cold, compiled for a minute or more
// under -race on a loaded machine, near its 2-minute compile timeout, and
// the test compiled it cold twice.
func TestServePrepare(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"logcall.wasm": testplugins.Test(t, "logcall"),
	})
	cache := t.TempDir()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--prepare", "--cache-dir", cache, dir}, nil, strings.NewReader(""), &out, &errb)
	if code != 0 {
		t.Fatalf("serve --prepare: exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"counter", "logcall", "loaded", "count"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("serve --prepare printed %q, want %q in it", out.String(), want)
		}
	}
	if strings.Contains(errb.String(), "serving MCP") {
		t.Errorf("serve --prepare served:\n%s", errb.String())
	}
	prepared := cacheFiles(t, cache)
	if len(prepared) < 2 {
		t.Fatalf("cache after --prepare holds %v, want both plugins' code", prepared)
	}

	// Served on the prepared cache: nothing compiled anew.
	_, stderr := serveInProcess(t, nil, "--no-watch", "--cache-dir", cache, dir)
	if !strings.Contains(stderr.String(), "plugins loaded") {
		t.Fatalf("serve did not load:\n%s", stderr.String())
	}
	if after := cacheFiles(t, cache); !slices.Equal(after, prepared) {
		t.Errorf("serving compiled again: cache %v after --prepare, %v after serving", prepared, after)
	}

	// One file that cannot be served: exit 1, its error printed, the
	// other file prepared.
	bad := filepath.Join(dir, "broken.wasm")
	if err := os.WriteFile(bad, []byte("\x00asm\x01\x00\x00\x00\x01garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"serve", "--prepare", "--cache-dir", t.TempDir(), dir}, nil, strings.NewReader(""), &out, &errb)
	if code != 1 {
		t.Errorf("serve --prepare with a broken file: exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "broken") || !strings.Contains(out.String(), "error") || !strings.Contains(out.String(), "loaded") {
		t.Errorf("serve --prepare with a broken file printed:\n%s", out.String())
	}
}

// TestStdioLeftBeforeLoadHints: a stdio client that leaves before the
// first load finished (a one-shot client on a cold cache) is told, in the
// log, that the cache is not filled and how to fill it.
func TestStdioLeftBeforeLoadHints(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"servlet.wasm": testplugins.Test(t, "servlet")})
	var out, errb bytes.Buffer
	// stdin at its end at once: the client left before the Go plugin
	// (about a second to compile cold) could be loaded.
	code := run(context.Background(), []string{"serve", "--cache-dir", t.TempDir(), dir}, nil, strings.NewReader(""), &out, &errb)
	if code != 0 {
		t.Fatalf("serve: exit %d\n%s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "serve --prepare") {
		t.Errorf("no hint of --prepare after the client left during the load:\n%s", errb.String())
	}
}

// TestPrepareCacheUnwritable: a compilation cache that cannot be written
// (here no file may grow past 1 KiB, as on a full volume) leaves every
// plugin served, and `serve --prepare`, whose job is to fill it, fails and
// says why. Every plugin failed to load on a full cache volume before.
func TestPrepareCacheUnwritable(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not found")
	}
	// counter, not hash: its machine code (2 KiB) is past the bound, and
	// it compiles in a second where hash, compiled twice (with the cache,
	// then without), outran its 2-minute compile timeout under -race on
	// a loaded machine.
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	var out, errb bytes.Buffer
	cmd := exec.Command(prlimit, "--fsize=1024", os.Args[0], "serve", "--prepare", "--cache-dir", t.TempDir(), dir)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("serve --prepare on an unwritable cache: %v, want exit 1\n%s%s", err, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "loaded") || !strings.Contains(out.String(), "could not be filled") {
		t.Errorf("serve --prepare printed:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "compilation cache unusable") {
		t.Errorf("no warning of the unusable cache:\n%s", errb.String())
	}
}

// TestPrepareRemoteFailureShown: a remote source that cannot be fetched
// is in what `serve --prepare` prints, with the reason, as a file that
// fails is. It printed an empty table and exited 1, the reason only in
// the log.
func TestPrepareRemoteFailureShown(t *testing.T) {
	// A loopback port nothing listens on: the fetch is refused at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--prepare", "--insecure-skip-signature", "--source-dir", t.TempDir(), "--cache-dir", t.TempDir(), "fetcher=oci://" + addr + "/you/fetch:v1"}, nil, strings.NewReader(""), &out, &errb)
	if code != 1 {
		t.Errorf("serve --prepare of an unreachable source: exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "fetcher") || !strings.Contains(out.String(), addr) {
		t.Errorf("serve --prepare of an unreachable source printed:\n%s\nwant the plugin and why it failed", out.String())
	}
}
