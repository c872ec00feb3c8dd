// Package proxytest starts real servers for tests: Redis, HAProxy and
// nginx, each on a free loopback port with its own config, waited for by
// polling until it answers (no fixed sleeps), and stopped by its PID when
// the test ends. A test waits on what a server reports in its output
// ([Process.WaitOutput]), such as HAProxy's health changes
// ([HAProxy.WaitUp]). It is for tests only.
//
// A missing binary fails the test when the environment has CI set, and
// skips it otherwise, naming the Debian package to install
// (scripts/deps.sh installs them all).
package proxytest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long a server may take to answer after its
// start: generous, for a loaded 2-core machine.
const StartTimeout = 20 * time.Second

// Find returns the path of the program name: on PATH, else in /usr/sbin
// or /usr/local/sbin, where Debian puts servers (and root's PATH may not).
func Find(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// Binary returns the path of the program name (see [Find]). When it is
// missing it fails t if the environment has CI set, else skips t, naming
// the Debian package pkg.
func Binary(t testing.TB, name, pkg string) string {
	t.Helper()
	if p, ok := Find(name); ok {
		return p
	}
	msg := fmt.Sprintf("install %s: apt-get install %s (or scripts/deps.sh)", name, pkg)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// FreeAddr returns a loopback address, 127.0.0.1:PORT, whose port was
// free a moment ago. The port is below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), so that no outgoing connection is
// given it as its own port: a server restarted on its address (a replica
// killed and started again, as the fault suite does) found it taken by a
// client's connection, on a machine busy with other tests.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	for range 200 {
		port := freePortFloor + rand.IntN(max(low-freePortFloor, 1))
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			addr := l.Addr().String()
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0") // every one tried was taken
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Listen listens on a loopback port for the test's life and hands over
// each connection it accepts: the server end of connections a test
// dials, to close or reset as it likes.
func Listen(t testing.TB) (addr string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			ch <- c
		}
	}()
	return ln.Addr().String(), ch
}

// freePortFloor is the lowest port FreeAddr picks: above the ports
// servers are configured with by default (Redis' 6379, registries' 5000,
// 8080 and the like).
const freePortFloor = 20000

// ephemeralLow is the first port of the kernel's ephemeral range, 32768
// (Linux's default) when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if n, _ := fmt.Sscan(string(b), &lo, &hi); n != 2 || lo <= freePortFloor {
		return 32768
	}
	return lo
}

// Process is a server started by [Start].
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	out  *SyncBuffer   // its stdout and stderr
}

// Exited says whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Output is what the process wrote so far, stdout and stderr together.
func (p *Process) Output() string { return p.out.String() }

// WaitOutput waits until cond holds of the process's output so far,
// testing it again on each write (a server's log is its signal), and
// reports whether it held. It gives up when the process has exited with
// cond still false (all its output read), or after timeout.
func (p *Process) WaitOutput(timeout time.Duration, cond func(out string) bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		out, written := p.out.next()
		if cond(out) {
			return true
		}
		select {
		case <-written:
		case <-p.done: // cmd.Wait copied all output before done closed
			return cond(p.Output())
		case <-timer.C:
			return cond(p.Output())
		}
	}
}

// Start runs cmd, stopped (SIGTERM, then SIGKILL after 5 s) by its PID in
// t's Cleanup, and waits until ready returns nil, polling every 20 ms up
// to [StartTimeout]. It fails t, with the process's output, if the process
// exits first or never gets ready.
func Start(t testing.TB, cmd *exec.Cmd, ready func() error) *Process {
	t.Helper()
	return StartWithin(t, cmd, StartTimeout, ready)
}

// StartWithin is [Start] with another bound on the wait for ready: a
// server that compiles plugins at start is slower than Redis.
func StartWithin(t testing.TB, cmd *exec.Cmd, timeout time.Duration, ready func() error) *Process {
	t.Helper()
	p := &Process{Cmd: cmd, done: make(chan struct{}), out: &SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var err error
	for {
		if err = ready(); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v: %v\n%s", filepath.Base(cmd.Path), timeout, err, p.Output())
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", filepath.Base(cmd.Path), cmd.ProcessState, p.Output())
		case <-tick.C:
		}
	}
}

// Signal sends sig to the process (its PID alone, not its group): a test's
// fault (SIGKILL, SIGSTOP, SIGCONT, SIGTERM).
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(p.Cmd.Process.Pid, sig)
}

// Stop ends the process as the test's Cleanup would (SIGTERM to its
// group, SIGKILL after 5 s), and returns once it has exited. A stopped
// (SIGSTOP) process is continued first, so that it can exit.
func (p *Process) Stop() { p.stop() }

// stop ends the process group it leads (nginx's workers too), by its PID.
func (p *Process) stop() {
	if p.Exited() {
		return
	}
	pid := p.Cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	syscall.Kill(-pid, syscall.SIGCONT) // a stopped process handles SIGTERM once continued
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-pid, syscall.SIGKILL)
		<-p.done
	}
}

// StartRedis starts redis-server on a free loopback port, with nothing
// saved to disk, and returns its address once it answers PING.
func StartRedis(t testing.TB) (addr string) {
	t.Helper()
	addr = FreeAddr(t)
	StartRedisAt(t, addr)
	return addr
}

// StartRedisAt starts redis-server at addr (127.0.0.1:PORT), empty and
// with nothing saved to disk, and returns it once it answers PING: a
// Redis restarted at the address its clients know.
func StartRedisAt(t testing.TB, addr string) *Process {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	return StartRedisWith(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) },
		"--port", port, "--bind", "127.0.0.1")
}

// StartRedisWith starts redis-server with args (where it listens, and
// how), empty and with nothing saved to disk, and returns it once a
// connection dial makes is answered PING.
func StartRedisWith(t testing.TB, dial func() (net.Conn, error), args ...string) *Process {
	t.Helper()
	bin := Binary(t, "redis-server", "redis-server")
	cmd := exec.Command(bin, append(args, "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--daemonize", "no", "--logfile", "")...)
	return Start(t, cmd, func() error { return RedisCommand(dial, "PING", "+PONG") })
}

// RedisCommand sends one inline command to a Redis over a connection dial
// makes, and reads the first line of its answer, which must begin with
// want.
func RedisCommand(dial func() (net.Conn, error), cmd, want string) error {
	c, err := dial()
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
	if !strings.HasPrefix(line, want) {
		return fmt.Errorf("%s answered %q", cmd, strings.TrimSpace(line))
	}
	return nil
}

// HAProxy is a haproxy started by [StartHAProxy]. Its methods fail the
// test that started it, and are for that test's goroutine only.
type HAProxy struct {
	*Process
	Addr string // where it listens: PROXY_ADDR
	t    testing.TB
}

// StartHAProxy starts haproxy in the foreground with the config at
// cfgPath, unchanged, and returns it once it accepts connections. The
// config reads its addresses from the environment ("${S1_ADDR}"); env
// gives them, and StartHAProxy adds PROXY_ADDR, a free loopback address
// the config must bind.
func StartHAProxy(t testing.TB, cfgPath string, env map[string]string) *HAProxy {
	t.Helper()
	return StartHAProxyAt(t, cfgPath, FreeAddr(t), env)
}

// StartHAProxyAt is [StartHAProxy] listening on addr: a proxy started
// again where its clients knew it.
func StartHAProxyAt(t testing.TB, cfgPath, addr string, env map[string]string) *HAProxy {
	t.Helper()
	bin := Binary(t, "haproxy", "haproxy")
	// -db: in the foreground, where haproxy reports each server's health
	// changes on stderr ("[WARNING] (pid) : Server sessions/s1 is DOWN, …"),
	// whatever the config's log lines.
	cmd := exec.Command(bin, "-f", cfgPath, "-db")
	cmd.Env = append(os.Environ(), "PROXY_ADDR="+addr)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := Start(t, cmd, func() error { return dial(addr) })
	return &HAProxy{Process: p, Addr: addr, t: t}
}

// serverState matches haproxy's report of a server's health change, once
// per change (its log line, when the config logs to stderr too, has no
// "[WARNING]").
var serverState = regexp.MustCompile(`(?m)^\[WARNING\] +\(\d+\) : Server (\S+) is (UP|DOWN)\b`)

// states returns the states haproxy reported for server (BACKEND/NAME)
// in out, oldest first.
func states(out, server string) []string {
	var s []string
	for _, m := range serverState.FindAllStringSubmatch(out, -1) {
		if m[1] == server {
			s = append(s, m[2])
		}
	}
	return s
}

// wait waits until haproxy's reports of server's state satisfy ok, and
// returns them; it fails the test after [StartTimeout].
func (h *HAProxy) wait(server, what string, ok func(states []string) bool) []string {
	h.t.Helper()
	var got []string
	if !h.WaitOutput(StartTimeout, func(out string) bool { got = states(out, server); return ok(got) }) {
		h.t.Fatalf("haproxy: %s is not %s after %v (its reports: %v):\n%s", server, what, StartTimeout, got, h.Output())
	}
	return got
}

// WaitUp waits until haproxy reports server (BACKEND/NAME, such as
// "sessions/s1") UP: its last report says UP, or there is none yet, as
// haproxy (2.6) starts a checked server UP, and only a failed check takes
// it down. It fails the test after [StartTimeout].
func (h *HAProxy) WaitUp(server string) {
	h.t.Helper()
	h.wait(server, "UP", func(s []string) bool { return len(s) == 0 || s[len(s)-1] == "UP" })
}

// WaitDown waits until haproxy's last report on server says DOWN. It
// fails the test after [StartTimeout].
func (h *HAProxy) WaitDown(server string) {
	h.t.Helper()
	h.wait(server, "DOWN", func(s []string) bool { return len(s) > 0 && s[len(s)-1] == "DOWN" })
}

// WaitRouted waits until haproxy reports server UP (see [HAProxy.WaitUp])
// and probe, tried then, confirms a request reaches it. A failed probe
// (a check failed on a loaded machine just then) is tried again once
// haproxy reports a change of server's state, not on a timer. It fails
// the test, with probe's last error, after [StartTimeout] without a
// report.
func (h *HAProxy) WaitRouted(server string, probe func() error) {
	h.t.Helper()
	for {
		seen := len(h.wait(server, "UP", func(s []string) bool { return len(s) == 0 || s[len(s)-1] == "UP" }))
		err := probe()
		if err == nil {
			return
		}
		if !h.WaitOutput(StartTimeout, func(out string) bool { return len(states(out, server)) > seen }) {
			h.t.Fatalf("haproxy: %s is UP but not reached: %v\n%s", server, err, h.Output())
		}
	}
}

// StartNginx starts nginx in the foreground (non-root friendly: its own
// prefix, pid file and temp directories under t.TempDir, errors on
// stderr) with the config at cfgPath, and returns the address it listens
// on once it accepts connections. nginx reads no environment, so each
// "${NAME}" in the config whose NAME is a key of env, or PROXY_ADDR (a
// free loopback address the config must listen on), is replaced by its
// value in a copy (as envsubst with a list of names would); nginx's own
// variables are left alone.
func StartNginx(t testing.TB, cfgPath string, env map[string]string) (addr string) {
	t.Helper()
	addr = FreeAddr(t)
	StartNginxAt(t, cfgPath, addr, env)
	return addr
}

// StartNginxAt is [StartNginx] listening on addr, returning its master
// process (the leader of its workers' group): a proxy started again
// where its clients knew it.
func StartNginxAt(t testing.TB, cfgPath, addr string, env map[string]string) *Process {
	t.Helper()
	bin := Binary(t, "nginx", "nginx-light")
	src, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"PROXY_ADDR": addr}
	for k, v := range env {
		vars[k] = v
	}
	conf := string(src)
	for k, v := range vars {
		conf = strings.ReplaceAll(conf, "${"+k+"}", v)
	}
	prefix := t.TempDir()
	os.Chmod(prefix, 0o755) // workers run as nobody when the master is root
	cfg := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	global := "daemon off; master_process on; pid " + filepath.Join(prefix, "nginx.pid") + ";"
	cmd := exec.Command(bin, "-e", "stderr", "-p", prefix+"/", "-c", cfg, "-g", global)
	return Start(t, cmd, func() error { return dial(addr) })
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers:
// a process's two streams, a log its test's clients write; a process's
// readers may wait for the next write.
type SyncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and dropped by every Write
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.b.Write(p)
}

// next returns what was written so far, and a channel closed by the next
// write.
func (b *SyncBuffer) next() (string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written == nil {
		b.written = make(chan struct{})
	}
	return b.b.String(), b.written
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// StartRedisReplica starts redis-server on a free loopback port as a
// replica of the Redis at primary (127.0.0.1:PORT), empty and with
// nothing saved to disk, and returns once its first sync with primary
// finished (its log says so) and it acknowledges primary's writes
// ([WaitReplica]): a write's WAIT on primary counts it from then.
// Stop it, or SIGSTOP it, through the Process.
func StartRedisReplica(t testing.TB, primary string) (addr string, p *Process) {
	t.Helper()
	addr = FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	host, pport, _ := net.SplitHostPort(primary)
	p = StartRedisWith(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) },
		"--port", port, "--bind", "127.0.0.1", "--replicaof", host, pport)
	if !p.WaitOutput(StartTimeout, func(out string) bool { return strings.Contains(out, "sync: Finished with success") }) {
		t.Fatalf("redis replica %s of %s: no sync within %v\n%s", addr, primary, StartTimeout, p.Output())
	}
	if err := WaitReplica(primary, StartTimeout); err != nil {
		t.Fatalf("redis replica %s of %s: %v\n%s", addr, primary, err, p.Output())
	}
	return addr, p
}

// WaitReplica writes on the Redis at primary (a counter in database 15,
// which no store under test uses) and waits, up to timeout, until WAIT
// says a replica has acknowledged the write: a replica streamed to, whose
// acknowledgements of later writes come at once. A replica's log saying
// its full sync finished is not enough: its acknowledgement of the sync
// can reach primary before primary has seen the sync's end (its RDB child
// not yet reaped), and primary then streams nothing to it until the next
// one, a second later. Nor is WAIT with nothing written, which counts
// such a replica.
func WaitReplica(primary string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", primary, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout + 5*time.Second))
	// One connection: WAIT waits for the writes of its own.
	if _, err := fmt.Fprintf(c, "SELECT 15\r\nINCR proxytest:replicated\r\nWAIT 1 %d\r\n", timeout.Milliseconds()); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	var line string
	for range 3 {
		if line, err = r.ReadString('\n'); err != nil {
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "-") {
			return fmt.Errorf("redis %s: %s", primary, line[1:])
		}
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(line, ":")); err != nil || n < 1 {
		return fmt.Errorf("redis %s: no replica acknowledged a write within %v (WAIT 1: %q)", primary, timeout, line)
	}
	return nil
}

// Sentinel timings of [StartSentinel]: a primary silent for
// SentinelDownAfter is down, and a failover is given SentinelFailoverTimeout.
const (
	SentinelDownAfter       = time.Second
	SentinelFailoverTimeout = 5 * time.Second
)

// StartSentinel starts redis-server as a Sentinel (--sentinel) on a free
// loopback port, monitoring the Redis at primary (127.0.0.1:PORT) as
// master name with a quorum of 1 (a Sentinel alone fails it over), and
// returns its address once it names primary and knows of replicas
// replicas of it (started before it, [StartRedisReplica]). It is stopped
// by its PID at the test's end.
func StartSentinel(t testing.TB, name, primary string, replicas int) (addr string, p *Process) {
	t.Helper()
	return StartSentinelTLS(t, name, primary, replicas, nil)
}

// StartSentinelTLS is [StartSentinel] with the Sentinel listening over
// TLS alone with s, and reaching the Redis servers over TLS (s nil: over
// TCP, as StartSentinel).
func StartSentinelTLS(t testing.TB, name, primary string, replicas int, s *ServerTLS) (addr string, p *Process) {
	t.Helper()
	bin := Binary(t, "redis-server", "redis-server")
	addr = FreeAddr(t)
	conf := sentinelConf(t, addr, name, primary, 1, SentinelDownAfter, SentinelFailoverTimeout, s)
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }
	if s != nil {
		dial = s.Dial(addr)
	}
	p = Start(t, exec.Command(bin, conf, "--sentinel", "--daemonize", "no", "--logfile", ""), func() error {
		if a, err := RedisArray(dial, "SENTINEL get-master-addr-by-name "+name); err != nil || len(a) != 2 || net.JoinHostPort(a[0], a[1]) != primary {
			return fmt.Errorf("master %s: %q (%v)", name, a, err)
		}
		if a, err := RedisArray(dial, "SENTINEL replicas "+name); err != nil || len(a) < replicas {
			return fmt.Errorf("replicas of %s: %d (%v)", name, len(a), err)
		}
		return nil
	})
	return addr, p
}

// SentinelConf writes the configuration of a Sentinel listening at addr
// (127.0.0.1:PORT) that monitors the Redis at primary as master name
// with quorum, calls it down after downAfter and gives a failover
// failoverTimeout, in a folder of its own (a Sentinel rewrites its
// configuration with what it learns), and returns the file's path.
func SentinelConf(t testing.TB, addr, name, primary string, quorum int, downAfter, failoverTimeout time.Duration) string {
	t.Helper()
	return sentinelConf(t, addr, name, primary, quorum, downAfter, failoverTimeout, nil)
}

// sentinelConf is [SentinelConf], with the Sentinel over TLS alone with
// s (not nil), towards its clients and the Redis servers.
func sentinelConf(t testing.TB, addr, name, primary string, quorum int, downAfter, failoverTimeout time.Duration, s *ServerTLS) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	phost, pport, _ := net.SplitHostPort(primary)
	dir := t.TempDir()
	listen := "port " + port
	if s != nil {
		listen = fmt.Sprintf("port 0\ntls-port %s\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"+
			"tls-auth-clients %s\ntls-replication yes", port, s.Cert, s.Key, s.CA.File, s.authClients())
	}
	cfg := fmt.Sprintf("%s\nbind %s\ndir %s\nsentinel monitor %s %s %s %d\n"+
		"sentinel down-after-milliseconds %[4]s %[8]d\nsentinel failover-timeout %[4]s %[9]d\n",
		listen, host, dir, name, phost, pport, quorum, downAfter.Milliseconds(), failoverTimeout.Milliseconds())
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// SentinelMaster returns the address (HOST:PORT) the Sentinel at sentinel
// gives for master name.
func SentinelMaster(sentinel, name string) (string, error) {
	a, err := RedisArray(func() (net.Conn, error) { return net.DialTimeout("tcp", sentinel, time.Second) },
		"SENTINEL get-master-addr-by-name "+name)
	if err != nil {
		return "", err
	}
	if len(a) != 2 {
		return "", fmt.Errorf("sentinel %s: master %s: %q", sentinel, name, a)
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// WaitSentinelMaster waits, up to timeout, until the Sentinel at sentinel
// gives want as master name's address (a failover done), asking it every
// 50 ms; it fails t otherwise.
func WaitSentinelMaster(t testing.TB, sentinel, name, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := SentinelMaster(sentinel, name)
		if err == nil && got == want {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("sentinel %s: master %s is %s (%v) after %v, want %s", sentinel, name, got, err, timeout, want)
		}
	}
}

// RedisArray sends one inline command over a connection dial makes and
// reads its answer as an array (of bulk strings, or of arrays: an
// element that is an array is counted, its contents skipped); an error
// reply is returned as an error, a nil array as none.
func RedisArray(dial func() (net.Conn, error), cmd string) ([]string, error) {
	c, err := dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	var read func() (string, error)
	read = func() (string, error) {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return "", fmt.Errorf("%s: empty reply line", cmd)
		}
		switch line[0] {
		case '-':
			return "", fmt.Errorf("%s: %s", cmd, line[1:])
		case '+', ':':
			return line[1:], nil
		case '$':
			n, err := strconv.Atoi(line[1:])
			if err != nil || n < 0 {
				return "", err
			}
			b := make([]byte, n+2)
			if _, err := io.ReadFull(r, b); err != nil {
				return "", err
			}
			return string(b[:n]), nil
		case '*':
			n, _ := strconv.Atoi(line[1:])
			for range max(n, 0) {
				if _, err := read(); err != nil {
					return "", err
				}
			}
			return "", nil
		}
		return "", fmt.Errorf("%s: reply %q", cmd, line)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "-") {
		return nil, fmt.Errorf("%s: %s", cmd, line[1:])
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("%s: not an array: %q", cmd, line)
	}
	n, _ := strconv.Atoi(line[1:])
	var out []string
	for range max(n, 0) {
		s, err := read()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
