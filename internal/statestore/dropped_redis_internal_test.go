//go:build unix

package statestore

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// TestRedisUnixSocketShutdownDropped: a Redis reached over a Unix socket
// removes the socket at shutdown, so that a dial finds no file
// (ENOENT), not a refusal. Every exchange after the one that met its
// connections closed must still be marked ErrDropped, under a short
// bound (go-redis dials five times, 100 ms apart: the deadline comes
// first) and a long one (the dial's own error, or the pool's last one
// once it stops dialing): the store went down, and may come back empty.
func TestRedisUnixSocketShutdownDropped(t *testing.T) {
	bin := proxytest.Binary(t, "redis-server", "redis-server")
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	p := proxytest.Start(t, exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--logfile", ""), func() error { return unixCommand(sock, "PING") })
	r, err := NewRedis("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	o := Owner{Replica: "a", Boot: "b"}
	ctx := context.Background()
	if err := r.Heartbeat(ctx, o, time.Minute); err != nil {
		t.Fatal(err)
	}
	unixCommand(sock, "SHUTDOWN NOSAVE")
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("redis-server still running after SHUTDOWN")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket outlived the server: %v", err)
	}
	// Past eight failed dials (PoolSize) the pool answers its last dial
	// error without dialing: marked still.
	bounds := []time.Duration{time.Second, 300 * time.Millisecond, 300 * time.Millisecond}
	for range 10 {
		bounds = append(bounds, 5*time.Second)
	}
	for _, bound := range bounds {
		bctx, cancel := context.WithTimeout(ctx, bound)
		err := r.Heartbeat(bctx, o, time.Minute)
		cancel()
		if !errors.Is(err, ErrDropped) {
			t.Errorf("bound %v: %v: not marked ErrDropped", bound, err)
		}
	}
}

// unixCommand sends one inline command to the Redis at sock and reads
// its answer's first line, if any.
func unixCommand(sock, cmd string) error {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.HasPrefix(line, "-") {
		return errors.New(strings.TrimSpace(line))
	}
	return nil
}
