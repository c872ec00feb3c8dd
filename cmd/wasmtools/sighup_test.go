package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// openPTY opens a pseudo-terminal pair (Linux: /dev/ptmx) for a process
// that must see a terminal on its stdin.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("ptsname: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// startServe starts a real wasmtools serve --http with a file:// source
// (so that it keeps a link folder) and stdin as given; its temporary
// folders go under tmp.
func startServe(t *testing.T, tmp string, stdin *os.File) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "wasmtools.toml")
	// versioned, a plugin of a few hundred bytes: what is tested is the
	// process's signals and link folder, and a Go plugin would only add
	// seconds of loading under -race to each start and reload.
	os.WriteFile(cfg, []byte("[plugins.versioned]\nsource = \"file://"+testplugins.Test(t, "versioned")+"\"\n"), 0o644)
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--http", freeAddr(t), "--source-dir", t.TempDir(), "--config", cfg)
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "TMPDIR="+tmp)
	stderr := &lockedBuffer{}
	cmd.Stdin, cmd.Stderr = stdin, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if !stderr.waitFor(time.Now().Add(time.Minute), contains("serving MCP over streamable HTTP", `msg="plugin sources fetched"`)) {
		t.Fatalf("serve did not start:\n%s", stderr.String())
	}
	return cmd, stderr
}

func links(t *testing.T, tmp string) []string {
	m, _ := filepath.Glob(filepath.Join(tmp, "wasmtools-links-*"))
	return m
}

// TestSIGHUP: detached, SIGHUP reloads and the server goes on; from a
// terminal, SIGHUP (the terminal closed) stops it as SIGTERM does; a
// SIGHUP during the shutdown that follows SIGTERM does not kill it
// midway; no link folder is left behind.
func TestSIGHUP(t *testing.T) {
	t.Run("detached", func(t *testing.T) {
		tmp := t.TempDir()
		devnull, _ := os.Open(os.DevNull)
		defer devnull.Close()
		cmd, stderr := startServe(t, tmp, devnull)
		if len(links(t, tmp)) != 1 {
			t.Fatalf("links = %v", links(t, tmp))
		}
		cmd.Process.Signal(syscall.SIGHUP)
		if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="SIGHUP: reloading"`)) {
			t.Fatalf("no reload:\n%s", stderr.String())
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Process.Signal(syscall.SIGHUP)
		err := cmd.Wait()
		if err != nil {
			t.Errorf("exit after SIGTERM and SIGHUP: %v\n%s", err, stderr.String())
		}
		if l := links(t, tmp); len(l) != 0 {
			t.Errorf("left behind: %v", l)
		}
	})
	t.Run("terminal", func(t *testing.T) {
		tmp := t.TempDir()
		_, tty := openPTY(t)
		cmd, stderr := startServe(t, tmp, tty)
		cmd.Process.Signal(syscall.SIGHUP)
		err := cmd.Wait()
		if err != nil || !strings.Contains(stderr.String(), "SIGHUP: the terminal closed: stopping") {
			t.Errorf("exit %v after SIGHUP from a terminal:\n%s", err, stderr.String())
		}
		if l := links(t, tmp); len(l) != 0 {
			t.Errorf("left behind: %v", l)
		}
	})
}

// TestProgressUI: on a terminal, a log line clears the line a bar is
// drawn on before it is written, and a finished pull leaves a line with
// its size, time and speed.
func TestProgressUI(t *testing.T) {
	var out strings.Builder
	p := newProgressUI(&out)
	p.tty = true // as on a terminal
	p.log = newLogger(p, false)
	p.event(sources.Event{Name: "fetch", Stage: "download", Done: 1 << 20, Total: 4 << 20})
	p.log.Info("plugin source fetched", "plugin", "other")
	p.event(sources.Event{Name: "fetch", Stage: "done", Done: 4 << 20, Total: 4 << 20, Elapsed: 2 * time.Second})
	s := out.String()
	i := strings.Index(s, "time=")
	if i < 0 || !strings.HasSuffix(s[:i], "\r\x1b[K") {
		t.Errorf("the log line does not clear the bar's line first: %q", s)
	}
	if !strings.Contains(s, "pulled fetch: 4.0 MiB in 2s (2.0 MiB/s)\n") {
		t.Errorf("no summary of the finished pull: %q", s)
	}
}
