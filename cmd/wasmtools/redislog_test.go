package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestSentinelFailoverLogged: the Redis client's own log lines (go-redis
// logs the primary Sentinel names, at the first dial and at each
// failover) reach the server's log, structured, at info level with
// component=redis, and none goes to stderr in go-redis's own format
// ("redis: 2026/12/07 08:00:00 sentinel.go:1248: ...").
func TestSentinelFailoverLogged(t *testing.T) {
	addr, primary := proxytest.FreeAddr(t), proxytest.FreeAddr(t)
	pp := proxytest.StartRedisAt(t, primary)
	replica, _ := proxytest.StartRedisReplica(t, primary)
	sentinel, _ := proxytest.StartSentinel(t, "wt", primary, 1)
	cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--no-watch", "--http", addr,
		"--replica", "s1", "--state-store", "redis://"+sentinel+"/0?master_name=wt", t.TempDir())
	cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1", "WASMTOOLS_STATE_KEY="+replicaStateKey)
	p := proxytest.StartWithin(t, cmd, startupTimeout, readyAt(addr))
	newMaster := func(at string) func(string) bool {
		line := regexp.MustCompile(`(?m)^time=\S+ level=INFO msg=".*new master.*` + regexp.QuoteMeta(at) + `.*" component=redis$`)
		return func(out string) bool { return line.MatchString(out) }
	}
	if !p.WaitOutput(10*time.Second, newMaster(primary)) {
		t.Errorf("no line of component=redis names the first primary %s:\n%s", primary, p.Output())
	}
	if err := pp.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-pp.Done()
	proxytest.WaitSentinelMaster(t, sentinel, "wt", replica, 30*time.Second)
	if !p.WaitOutput(20*time.Second, newMaster(replica)) {
		t.Errorf("no line of component=redis names the new primary %s:\n%s", replica, p.Output())
	}
	for _, l := range strings.Split(p.Output(), "\n") {
		if strings.HasPrefix(l, "redis: ") {
			t.Errorf("a line in go-redis's own format: %s", l)
		}
	}
}
